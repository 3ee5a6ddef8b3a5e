//! The real `fencegate` binary as a child process, for what only a process can show: surviving
//! `kill -9`, exit codes, resident memory, and running under `prlimit` limits ([`Launch`]).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a started binary may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct GatewayProcess {
    child: Child,
    pub addr: SocketAddr,
    /// The admin listener, when started by a [`Launch`] with [`Launch::admin`].
    pub admin: Option<SocketAddr>,
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_fencegate")
}

/// A port that was free a moment ago.
pub fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind probe");
    listener.local_addr().expect("probe address")
}

impl GatewayProcess {
    /// Writes a config with `routes_toml` and the store under `dir`, and starts `fencegate serve`.
    pub fn start(dir: &Path, routes_toml: &str) -> GatewayProcess {
        GatewayProcess::start_with_store(dir, &super::gateway::embedded_store(dir), routes_toml)
    }

    /// Like `start`, with the given `[store]` table (the gateway's own state still goes to `dir`).
    pub fn start_with_store(dir: &Path, store_toml: &str, routes_toml: &str) -> GatewayProcess {
        GatewayProcess::start_with_env(dir, store_toml, routes_toml, &[])
    }

    /// Like `start_with_store`, with extra environment variables (secrets named by `*_env`).
    pub fn start_with_env(
        dir: &Path,
        store_toml: &str,
        routes_toml: &str,
        env: &[(&str, &str)],
    ) -> GatewayProcess {
        let addr = free_port();
        let text =
            super::gateway::config_text_with_store(dir, &addr.to_string(), store_toml, routes_toml);
        let config = dir.join("fencegate.toml");
        std::fs::write(&config, text).expect("write config");
        let mut process = GatewayProcess {
            child: spawn_serve(&config, &[], "warn", env, Stdio::inherit()),
            addr,
            admin: None,
        };
        process.wait_until_listening();
        process
    }

    /// Starts `fencegate serve --config config` on a file the test wrote itself, whose `listen`
    /// is `addr`, so that a restart comes back on the same address. Its stderr is appended to
    /// [`stderr_path`] of the file's directory, across restarts.
    pub fn serve_file(config: &Path, addr: SocketAddr, env: &[(&str, &str)]) -> GatewayProcess {
        let dir = config.parent().expect("the config file's directory");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr_path(dir))
            .expect("open the stderr file");
        let mut process = GatewayProcess {
            child: spawn_serve(config, &[], "warn", env, stderr.into()),
            addr,
            admin: None,
        };
        if let Err(status) = process.wait_listening_or_exit() {
            let log = std::fs::read_to_string(stderr_path(dir)).unwrap_or_default();
            panic!("fencegate exited during start-up: {status}\n{log}");
        }
        process
    }

    /// Like `start`, with `extra_args` after `serve --config FILE`, `RUST_LOG=rust_log`, and
    /// stderr written to [`stderr_path`]`(dir)` for the test to read.
    pub fn start_logging(
        dir: &Path,
        routes_toml: &str,
        extra_args: &[&str],
        rust_log: &str,
    ) -> GatewayProcess {
        let addr = free_port();
        let text = super::gateway::config_text(dir, &addr.to_string(), routes_toml);
        let config = dir.join("fencegate.toml");
        std::fs::write(&config, text).expect("write config");
        let stderr = std::fs::File::create(stderr_path(dir)).expect("create stderr file");
        let mut process = GatewayProcess {
            child: spawn_serve(&config, extra_args, rust_log, &[], stderr.into()),
            addr,
            admin: None,
        };
        process.wait_until_listening();
        process
    }

    /// Sends SIGTERM and returns at once; see [`GatewayProcess::wait_exit`].
    pub fn signal_terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit on its own, panicking after `timeout`.
    pub fn wait_exit(mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll fencegate") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "fencegate did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_until_listening(&mut self) {
        if let Err(status) = self.wait_listening_or_exit() {
            panic!("fencegate exited during start-up: {status}");
        }
    }

    /// Waits until the data plane (and the admin listener, if any) accept connections, or the
    /// process exits (its status).
    fn wait_listening_or_exit(&mut self) -> Result<(), ExitStatus> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while Instant::now() < deadline {
            let accepting = |addr: SocketAddr| TcpStream::connect(addr).is_ok();
            if accepting(self.addr) && self.admin.is_none_or(accepting) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "fencegate did not listen on {} within {STARTUP_TIMEOUT:?}",
            self.addr
        );
    }

    /// The exit status, if the process has exited (without waiting).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll fencegate")
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin.expect("an admin listener"), path)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill_9(mut self) {
        self.child.kill().expect("kill -9");
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status of the graceful shutdown.
    pub fn terminate(mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        self.child.wait().expect("wait for fencegate")
    }

    /// A field of /proc/PID/status in KiB (`VmRSS`, `VmHWM`).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} not in /proc status"))
    }
}

/// How to start the binary: extra `[server]` options, an `[admin]` table, and resource limits
/// set with `prlimit` (util-linux) before it runs. Its stderr goes to [`stderr_path`]`(dir)`.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    server_options: String,
    admin: Option<String>,
    limits: Vec<String>,
    /// Top-level tables appended to the file (`[telemetry]`, ...).
    tables: String,
    /// `RUST_LOG` (default `warn`) and arguments after `serve --config FILE`.
    rust_log: Option<String>,
    args: Vec<String>,
    /// Fixed data-plane and admin addresses (a replica restarted where it was) instead of free
    /// ports.
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
}

/// How a [`Launch`] ended when the binary was not expected to serve.
pub enum Started {
    Listening(GatewayProcess),
    Exited { status: ExitStatus, stderr: String },
}

impl Launch {
    pub fn new() -> Launch {
        Launch::default()
    }

    /// TOML lines added to `[server]`.
    pub fn server(mut self, options: &str) -> Launch {
        self.server_options.push_str(options);
        self.server_options.push('\n');
        self
    }

    /// Serve on `listen` (and the admin listener, if any, on `admin`) instead of free ports.
    pub fn at(mut self, listen: SocketAddr, admin: SocketAddr) -> Launch {
        self.listen = Some(listen);
        self.admin_listen = Some(admin);
        self
    }

    /// An `[admin]` listener on a free port with bearer `token` and the TOML lines `options`.
    pub fn admin(mut self, token: &str, options: &str) -> Launch {
        self.admin = Some(format!("token = \"{token}\"\n{options}\n"));
        self
    }

    /// TOML tables appended to the configuration file.
    pub fn table(mut self, toml: &str) -> Launch {
        self.tables.push('\n');
        self.tables.push_str(toml);
        self.tables.push('\n');
        self
    }

    /// Runs with `RUST_LOG=rust_log` and `args` after `serve --config FILE`.
    pub fn logging(mut self, rust_log: &str, args: &[&str]) -> Launch {
        self.rust_log = Some(rust_log.to_owned());
        self.args = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    /// A `prlimit` option the binary runs under, e.g. `--as=2200000000` or `--nofile=1024:1024`.
    pub fn prlimit(mut self, limit: &str) -> Launch {
        self.limits.push(limit.to_owned());
        self
    }

    /// Starts `fencegate serve` with `routes_toml` and its store under `dir`; panics (with its
    /// stderr) if it exits instead of listening.
    pub fn start(self, dir: &Path, routes_toml: &str) -> GatewayProcess {
        match self.start_or_exit(dir, routes_toml) {
            Started::Listening(process) => process,
            Started::Exited { status, stderr } => {
                panic!("fencegate exited during start-up: {status}\n{stderr}")
            }
        }
    }

    /// Like `start`, returning the exit status and stderr if the binary exits before listening.
    pub fn start_or_exit(self, dir: &Path, routes_toml: &str) -> Started {
        let addr = self.listen.unwrap_or_else(free_port);
        let admin = self
            .admin
            .as_ref()
            .map(|_| self.admin_listen.unwrap_or_else(free_port));
        let mut text = super::gateway::with_server_options(
            &super::gateway::config_text(dir, &addr.to_string(), routes_toml),
            &self.server_options,
        );
        if let (Some(admin_addr), Some(table)) = (admin, &self.admin) {
            text.push_str(&format!("\n[admin]\nlisten = \"{admin_addr}\"\n{table}"));
        }
        text.push_str(&self.tables);
        let config = dir.join("fencegate.toml");
        std::fs::write(&config, &text).expect("write config");
        let stderr = std::fs::File::create(stderr_path(dir)).expect("create stderr file");
        let mut command = if self.limits.is_empty() {
            Command::new(binary())
        } else {
            assert!(
                Command::new("prlimit")
                    .arg("--version")
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success()),
                "these tests run the binary under `prlimit` (util-linux), which is not installed"
            );
            let mut command = Command::new("prlimit");
            command.args(&self.limits).arg("--").arg(binary());
            command
        };
        // prlimit sets the limits on itself and then executes the binary: the child is fencegate.
        let child = command
            .args(["serve", "--config"])
            .arg(&config)
            .args(&self.args)
            .env("RUST_LOG", self.rust_log.as_deref().unwrap_or("warn"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start fencegate");
        let mut process = GatewayProcess { child, addr, admin };
        match process.wait_listening_or_exit() {
            Ok(()) => Started::Listening(process),
            Err(status) => Started::Exited {
                status,
                stderr: std::fs::read_to_string(stderr_path(dir)).unwrap_or_default(),
            },
        }
    }
}

/// Where [`GatewayProcess::start_logging`] writes the binary's stderr.
pub fn stderr_path(dir: &Path) -> std::path::PathBuf {
    dir.join("fencegate.stderr")
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `fencegate serve --config config extra_args` with `RUST_LOG=rust_log` and `env`, no stdin or
/// stdout, and stderr where the caller says.
fn spawn_serve(
    config: &Path,
    extra_args: &[&str],
    rust_log: &str,
    env: &[(&str, &str)],
    stderr: Stdio,
) -> std::process::Child {
    Command::new(binary())
        .args(["serve", "--config"])
        .arg(config)
        .args(extra_args)
        .env("RUST_LOG", rust_log)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start fencegate")
}
