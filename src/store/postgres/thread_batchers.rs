//! Per-thread advance batchers on PostgreSQL: each thread that asks (each serving thread) gets
//! its own batching task and its own connections, all on that thread's runtime, so a batch's I/O
//! and the wake-ups of its requests stay on the thread that serves them. Requests that arrive
//! while a thread's statements run go together in its next one.

use std::sync::{Arc, Mutex, PoisonError};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::sync::mpsc;

use super::advance::{execute, AdvanceRequest, Executed};
use super::{fail_batch, CONNECT_TIMEOUT};
use crate::store::expected::ExpectedIdentity;
use crate::store::plumbing::batches::{run_batches, QUEUE};
use crate::store::plumbing::per_thread::PerThread;
use crate::store::StoreError;

pub(super) struct ThreadBatchers {
    batchers: PerThread<mpsc::Sender<AdvanceRequest>>,
    options: PgConnectOptions,
    max_batch: usize,
    /// Batches one thread runs at once (`batches_in_flight`).
    in_flight: usize,
    expected: Arc<ExpectedIdentity>,
}

impl ThreadBatchers {
    pub(super) fn new(
        options: PgConnectOptions,
        max_batch: usize,
        in_flight: usize,
        expected: Arc<ExpectedIdentity>,
    ) -> ThreadBatchers {
        ThreadBatchers {
            batchers: PerThread::new(),
            options,
            max_batch: max_batch.max(1),
            in_flight: in_flight.max(1),
            expected,
        }
    }

    /// Queues `request` on the calling thread's batcher, started on the calling runtime if there
    /// is none (or its runtime has ended).
    pub(super) async fn send(&self, request: AdvanceRequest) -> Result<(), StoreError> {
        let batcher = self.batchers.queue(|| {
            let (batcher, requests) = mpsc::channel(QUEUE);
            tokio::spawn(run(
                self.options.clone(),
                self.max_batch,
                self.in_flight,
                Arc::clone(&self.expected),
                requests,
            ));
            batcher
        })?;
        batcher.send(request).await.map_err(|_| StoreError::Closed)
    }

    /// Stops every batcher once its queue is answered; later requests fail with `Closed`.
    pub(super) fn close(&self) {
        drop(self.batchers.close());
    }
}

/// Runs one batch on an idle connection of the thread's (or a new one). A statement that failed
/// on a connection that sat idle — the store may have dropped it meanwhile — is sent once more on
/// a new connection (see [`execute`] for how its answers are then read); a failed connection is
/// never reused.
async fn run_batch(
    options: &PgConnectOptions,
    idle: &Mutex<Vec<PgConnection>>,
    batch: Vec<AdvanceRequest>,
    expected: Option<&str>,
) {
    let reused = idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
    let (mut connection, repeatable) = match reused {
        Some(connection) => (connection, true),
        None => match connect(options).await {
            Ok(fresh) => (fresh, false),
            Err(source) => return fail_batch(batch.into_iter().map(|r| r.reply), source),
        },
    };
    let mut executed = execute(&mut connection, batch, expected, false).await;
    if let (Executed::Failed { .. }, true) = (&executed, repeatable) {
        let Executed::Failed { batch, source } = executed else {
            return;
        };
        tracing::warn!(error = %source, "postgres advance failed on an idle connection; repeating it on a new one");
        connection = match connect(options).await {
            Ok(fresh) => fresh,
            Err(source) => return fail_batch(batch.into_iter().map(|r| r.reply), source),
        };
        executed = execute(&mut connection, batch, expected, true).await;
    }
    match executed {
        Executed::Answered => idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(connection),
        Executed::Failed { batch, source } => {
            tracing::error!(error = %source, "postgres advance failed");
            fail_batch(batch.into_iter().map(|r| r.reply), source);
        }
    }
}

/// A new connection of the thread's own, within the connect timeout.
async fn connect(options: &PgConnectOptions) -> Result<PgConnection, sqlx::Error> {
    match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(fresh)) => Ok(fresh),
        Ok(Err(source)) => {
            tracing::error!(error = %source, "postgres advance connection failed");
            Err(source)
        }
        Err(_) => {
            tracing::error!("postgres advance connection timed out");
            Err(sqlx::Error::PoolTimedOut)
        }
    }
}

/// One thread's batcher: runs up to `in_flight` batches at once, each on a connection of the
/// thread's own (opened when none is idle, dropped after a failed statement).
async fn run(
    options: PgConnectOptions,
    max_batch: usize,
    in_flight: usize,
    expected: Arc<ExpectedIdentity>,
    requests: mpsc::Receiver<AdvanceRequest>,
) {
    let idle: Arc<Mutex<Vec<PgConnection>>> = Arc::new(Mutex::new(Vec::new()));
    // Each batch is spawned on this thread's runtime: the statement's I/O stays on this thread.
    run_batches(requests, max_batch, in_flight, |batch| {
        let (idle, options) = (Arc::clone(&idle), options.clone());
        let expected = expected.get();
        async move { run_batch(&options, &idle, batch, expected.as_deref()).await }
    })
    .await;
    // The store closed and the running batches have finished: close the idle connections.
    let connections = std::mem::take(&mut *idle.lock().unwrap_or_else(PoisonError::into_inner));
    for connection in connections {
        let _ = connection.close().await;
    }
}
