//! The threads that serve client connections: one single-threaded tokio runtime per core, each
//! with its own copy of the gateway (and so its own pool of upstream connections). A connection is
//! served start to end on one thread, and so are the upstream connections its requests use, so no
//! wake-up on the proxy path crosses threads.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::gateway::Gateway;

/// One serving thread: its runtime, the gateway its connections use, and how to stop it.
pub struct Worker<G = Gateway> {
    pub runtime: Handle,
    pub gateway: G,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The serving threads; connections are handed to them in turn.
pub struct Workers<G = Gateway> {
    workers: Vec<Worker<G>>,
    next: AtomicUsize,
}

impl<G> Workers<G> {
    /// Starts `count` threads (at least one), each with a gateway from `gateway`.
    pub fn start(count: usize, gateway: impl Fn() -> G) -> io::Result<Workers<G>> {
        let mut workers = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let (ready, runtime) = std::sync::mpsc::channel();
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("fencegate-worker-{index}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    if ready.send(Ok(runtime.handle().clone())).is_err() {
                        return;
                    }
                    // Runs the connections spawned onto this runtime until told to stop.
                    let _ = runtime.block_on(stopped);
                })?;
            let runtime = runtime
                .recv()
                .map_err(|_| io::Error::other("a serving thread ended before it started"))??;
            workers.push(Worker {
                runtime,
                gateway: gateway(),
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(Workers {
            workers,
            next: AtomicUsize::new(0),
        })
    }

    /// The worker for the next connection.
    pub fn next(&self) -> &Worker<G> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        &self.workers[index]
    }
}

impl<G> Drop for Workers<G> {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            if let Some(stop) = worker.stop.take() {
                let _ = stop.send(());
            }
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Workers;

    #[test]
    fn connections_go_round_to_each_thread_and_run_there() {
        let workers = Workers::start(3, || ()).expect("threads");
        let mut names = Vec::new();
        for _ in 0..6 {
            let (sent, name) = std::sync::mpsc::channel();
            workers.next().runtime.spawn(async move {
                let _ = sent.send(std::thread::current().name().map(str::to_owned));
            });
            names.push(name.recv().expect("the task ran").expect("a named thread"));
        }
        assert_eq!(
            names,
            [0, 1, 2, 0, 1, 2].map(|i| format!("fencegate-worker-{i}"))
        );
        // Dropping stops and joins the threads.
        drop(workers);
    }

    #[test]
    fn at_least_one_thread_is_started() {
        let workers = Workers::start(0, || 7).expect("threads");
        assert_eq!(workers.next().gateway, 7);
    }
}
