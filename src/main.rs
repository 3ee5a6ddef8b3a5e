//! The `fencegate` binary: parses flags, starts logging, loads the configuration and hands it to
//! [`fencegate::App`]. Everything else lives in the library, where the tests reach it too, but
//! for what only the command line uses (`cli/`).
#![forbid(unsafe_code)]

mod cli;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use cli::admin_client::AdminClient;
use fencegate::compiled::Compiled;

/// mimalloc instead of the system allocator: a proxied request makes a few dozen small
/// allocations (header maps, boxed futures, buffers), and glibc's malloc and free were about 15%
/// of the instructions of a passthrough request under callgrind.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A fencing-aware HTTP reverse proxy: stale lock holders cannot write.
#[derive(Parser)]
#[command(name = "fencegate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// How log lines on stderr are written: `text` for people, `json` (one object per line)
        /// for log shippers. `RUST_LOG` filters either.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Validate a configuration file without serving; exits non-zero with the first error.
    CheckConfig {
        /// The configuration file (TOML).
        #[arg(required_unless_present = "config", conflicts_with = "config")]
        file: Option<PathBuf>,
        /// The same file, named as every other subcommand takes it.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Operate on the fence store.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Intent records of idempotent routes: list the ambiguous ones, resolve them.
    Intents {
        #[command(subcommand)]
        command: IntentsCommand,
    },
    /// Probe a running gateway through its admin listener: exit 0 when `/readyz` answers 200
    /// (ready to fence), 1 otherwise. For container health checks.
    Health {
        /// The configuration file (TOML) the gateway runs with; its `[admin]` is probed.
        #[arg(long, short)]
        config: PathBuf,
        /// Probe `/healthz` (the process serves) instead of `/readyz`.
        #[arg(long)]
        live: bool,
    },
    /// Create the store's schema and apply pending migrations (PostgreSQL), then exit.
    Migrate {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

/// The shape of the log lines written to stderr.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl From<LogFormat> for fencegate::logging::LogFormat {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Text => fencegate::logging::LogFormat::Text,
            LogFormat::Json => fencegate::logging::LogFormat::Json,
        }
    }
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Trust the store as it is now: record its identity in this gateway's state directory.
    /// Run it after checking why a gateway refused its store (a wiped or replaced store resets
    /// every mark: claim current tokens or raise marks before adopting if you can).
    Adopt {
        /// The configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum IntentsCommand {
    /// List SUBMITTING intents (outcome unknown) not updated for at least `--older-than`.
    List {
        #[arg(long, short)]
        config: PathBuf,
        /// e.g. "60s", "10m".
        #[arg(long, default_value = "60s")]
        older_than: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Record what the provider says happened to a SUBMITTING intent, or release it for retry.
    Resolve {
        #[arg(long, short)]
        config: PathBuf,
        /// The intent's key as listed (`route/idempotency-key`).
        key: String,
        /// Forget the intent: the next attempt submits again with the same idempotency key.
        #[arg(long, conflicts_with = "status")]
        release: bool,
        /// The provider's status for the call, to be replayed to repeats.
        #[arg(long, required_unless_present = "release")]
        status: Option<u16>,
        /// The provider's body for the call.
        #[arg(long, default_value = "")]
        body: String,
        /// A header to replay with it, as `name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = match &cli.command {
        Command::Serve { log_format, .. } => *log_format,
        _ => LogFormat::Text,
    };
    // `serve` logs through a writer thread (a line per request must not cost a write each);
    // the one-shot commands write their few lines at once.
    let started = match &cli.command {
        Command::Serve { .. } => fencegate::logging::start_buffered(log_format.into()).map(Some),
        _ => fencegate::logging::start(log_format.into()).map(|()| None),
    };
    let _log_writer = match started {
        Ok(writer) => writer,
        Err(e) => {
            eprintln!("warning: logging not started: {e}");
            None
        }
    };
    match cli.command {
        Command::CheckConfig { file, config } => check_config(file.or(config)),
        Command::Serve { config, .. } => serve(&config),
        Command::Migrate { config } => migrate(&config),
        Command::Health { config, live } => health(&config, live),
        Command::Store {
            command: StoreCommand::Adopt { config },
        } => adopt(&config),
        Command::Intents { command } => fencegate_intents(command),
    }
}

fn fencegate_intents(command: IntentsCommand) -> ExitCode {
    let path = match &command {
        IntentsCommand::List { config, .. } | IntentsCommand::Resolve { config, .. } => {
            config.clone()
        }
    };
    one_shot(&path, |config| async move {
        let opened =
            fencegate::store::open(&config.store, &fencegate::guard::Replica::fresh().id).await;
        let backend = match opened {
            Ok(backend) => backend,
            // A running gateway holds the embedded store's file: reconcile through it.
            Err(e) if e.held_by_another_process() => {
                let Some(admin) = &config.admin else {
                    return Err(format!(
                        "{e}\na running gateway holds the embedded store: add an [admin] section to its configuration (and restart it) to reconcile while it serves, or stop it first"
                    ));
                };
                let client = AdminClient::new(admin).map_err(|e| e.to_string())?;
                return cli::intents::run_remote(&client, command.into()).await;
            }
            Err(e) => return Err(e.to_string()),
        };
        let result = cli::intents::run(backend.intents.as_ref(), command.into()).await;
        let _ = backend.fences.close().await;
        result
    })
}

/// `fencegate health`: exits 0 when the running gateway's admin listener answers 200 on
/// `/readyz` (or `/healthz` with `--live`), 1 otherwise, printing what it answered.
fn health(path: &Path, live: bool) -> ExitCode {
    one_shot(path, |config| async move {
        let admin = config.admin.as_ref().ok_or(
            "the configuration has no [admin] section: the health endpoints live on the admin listener",
        )?;
        let client = AdminClient::for_probes(admin).map_err(|e| e.to_string())?;
        let probe = if live { "/healthz" } else { "/readyz" };
        let answer = client.get(probe).await.map_err(|e| e.to_string())?;
        let text = answer.text();
        if answer.status.is_success() {
            Ok(text)
        } else {
            Err(format!(
                "{probe} answered {}: {}",
                answer.status,
                text.trim()
            ))
        }
    })
}

impl From<IntentsCommand> for cli::intents::Request {
    fn from(command: IntentsCommand) -> Self {
        use cli::intents::Request;
        match command {
            IntentsCommand::List {
                older_than, limit, ..
            } => Request::List { older_than, limit },
            IntentsCommand::Resolve {
                key,
                release,
                status,
                body,
                headers,
                ..
            } => Request::Resolve {
                key,
                release,
                status,
                body,
                headers,
            },
        }
    }
}

fn adopt(path: &Path) -> ExitCode {
    one_shot(path, |config| async move {
        let state_dir = config.server.state_dir.clone();
        let store = fencegate::store::open(&config.store, &fencegate::guard::Replica::fresh().id)
            .await
            .map_err(|e| e.to_string())?
            .fences;
        let adopted = fencegate::guard::adoption::adopt(store.as_ref(), &state_dir).await;
        let _ = store.close().await;
        let identity = adopted.map_err(|e| e.to_string())?;
        Ok(format!(
            "adopted {} store {} in {}: a running gateway with this state directory resumes fenced traffic at its next store check\n",
            config.store.backend(),
            identity.id,
            state_dir.display()
        ))
    })
}

fn migrate(path: &Path) -> ExitCode {
    one_shot(path, |config| async move {
        let fencegate::config::StoreConfig::Postgres(postgres) = &config.store else {
            return Ok(format!(
                "the {} store creates its schema when it opens; nothing to migrate\n",
                config.store.backend()
            ));
        };
        migrate_schema(postgres).await
    })
}

/// Applies the PostgreSQL schema's pending migrations; what was applied, as text.
#[cfg(feature = "postgres")]
async fn migrate_schema(
    postgres: &fencegate::config::PostgresStoreConfig,
) -> Result<String, String> {
    let applied = fencegate::store::migrate_postgres(postgres)
        .await
        .map_err(|e| e.to_string())?;
    if applied.is_empty() {
        return Ok(format!(
            "schema {} was already up to date: no migration to apply\n",
            postgres.schema
        ));
    }
    let mut text = format!(
        "schema {}: applied {} migration(s)\n",
        postgres.schema,
        applied.len()
    );
    for migration in applied {
        text.push_str(&format!("  {migration}\n"));
    }
    text.push_str("the schema is now up to date\n");
    Ok(text)
}

/// This build has no PostgreSQL store (`check-config` refuses such a configuration first).
#[cfg(not(feature = "postgres"))]
async fn migrate_schema(_: &fencegate::config::PostgresStoreConfig) -> Result<String, String> {
    Err(fencegate::config::not_built_message(
        "PostgreSQL store",
        "postgres",
    ))
}

/// The shape of every one-shot command: load the configuration, run `task` on a single-threaded
/// runtime, print what it returns, and exit non-zero with its error.
fn one_shot<F, Fut>(path: &Path, task: F) -> ExitCode
where
    F: FnOnce(fencegate::Config) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let config = match Compiled::load(path) {
        Ok(compiled) => compiled.config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(task(config)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(path: &Path) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let compiled = match Compiled::parse(&text, path)
        .and_then(|c| fencegate::config::check_environment(&c.config, path).map(|()| c))
    {
        Ok(compiled) => compiled,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let mut signals = Signals::install();
        // A start that hangs (a store that accepts but never answers, a lock held by a stuck
        // replica) still stops on SIGTERM or ctrl-c.
        let started = tokio::select! {
            started = start(compiled) => started,
            signal = signals.stop_requested() => {
                tracing::info!("{signal} received during start-up: stopping before serving");
                return ExitCode::SUCCESS;
            }
        };
        let (mut app, listener) = match started {
            Ok(started) => started,
            Err(e) => {
                // Printed as configuration errors are, whatever RUST_LOG keeps.
                eprintln!("error: {}: cannot serve: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        app.set_config_source(path, &text);
        #[cfg(unix)]
        let reloads = tokio::spawn(reload_on_sighup(app.reloader(), signals.hangup.take()));
        #[cfg(not(unix))]
        let reloads = tokio::spawn(reload_on_sighup(app.reloader()));
        let shutdown = stop_after_delay(signals, app.stopping(), app.drain_delay());
        app.serve(listener, shutdown).await;
        reloads.abort();
        ExitCode::SUCCESS
    })
}

/// Opens the store and binds both listeners: a configured admin listener that cannot bind is a
/// failed start, not a gateway without its health checks and admin API.
async fn start(compiled: Compiled) -> Result<(fencegate::App, tokio::net::TcpListener), String> {
    let mut app = fencegate::App::build(compiled)
        .await
        .map_err(|e| e.to_string())?;
    let listener = app
        .bind()
        .await
        .map_err(|e| format!("server.listen: {e}"))?;
    app.bind_admin()
        .await
        .map_err(|e| format!("admin.listen: {e}"))?;
    Ok((app, listener))
}

/// The signals the gateway acts on, installed before anything starts: a SIGTERM or SIGHUP that
/// arrives while the store opens or the listeners bind is then handled once serving begins,
/// instead of taking its default action (ending the process without draining).
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Resolves with the signal's name on SIGTERM or SIGINT (ctrl-c elsewhere).
    async fn stop_requested(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            async fn received(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = received(&mut self.terminate) => "SIGTERM",
                () = received(&mut self.interrupt) => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "ctrl-c",
                Err(_) => std::future::pending::<&'static str>().await,
            }
        }
    }

    fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let install = |kind: SignalKind, name: &str| {
                signal(kind)
                    .map_err(|e| tracing::warn!(error = %e, "cannot handle {name}"))
                    .ok()
            };
            Signals {
                terminate: install(SignalKind::terminate(), "SIGTERM"),
                interrupt: install(SignalKind::interrupt(), "SIGINT"),
                hangup: install(SignalKind::hangup(), "SIGHUP"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }
}

/// Reloads the routes on every SIGHUP (the reloader logs and counts each outcome).
async fn reload_on_sighup(
    reloader: std::sync::Arc<fencegate::reload::Reloader>,
    #[cfg(unix)] hangup: Option<tokio::signal::unix::Signal>,
) {
    #[cfg(unix)]
    {
        let Some(mut hangups) = hangup else {
            tracing::warn!("cannot listen for SIGHUP; reload through the admin API instead");
            return;
        };
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP received: reloading the configuration");
            let _ = reloader.reload();
        }
    }
    #[cfg(not(unix))]
    let _ = reloader;
}

/// Resolves when the drain should begin: on SIGTERM or SIGINT (ctrl-c elsewhere) `/readyz`
/// turns to 503 at once, and the listener keeps serving for `drain_delay` (so that load
/// balancers stop sending here first), or until a second such signal.
async fn stop_after_delay(
    mut signals: Signals,
    stopping: fencegate::server::Stopping,
    drain_delay: std::time::Duration,
) {
    let signal = signals.stop_requested().await;
    stopping.begin();
    if drain_delay.is_zero() {
        tracing::info!("{signal} received: draining");
        return;
    }
    tracing::info!(
        "{signal} received: /readyz answers 503, serving for {drain_delay:?} more before draining"
    );
    tokio::select! {
        () = tokio::time::sleep(drain_delay) => tracing::info!("drain delay over: draining"),
        signal = signals.stop_requested() => tracing::info!("{signal} received again: draining now"),
    }
}

/// `check-config`: compiles the file as `serve` would, without serving.
fn check_config(file: Option<PathBuf>) -> ExitCode {
    let Some(file) = file else {
        eprintln!("error: name the configuration file: fencegate check-config --config FILE");
        return ExitCode::FAILURE;
    };
    let checked = Compiled::load(&file)
        .and_then(|c| fencegate::config::check_environment(&c.config, &file).map(|()| c));
    match checked {
        Ok(compiled) => {
            println!(
                "{}: ok ({} routes)",
                file.display(),
                compiled.config.routes.len()
            );
            for route in compiled.routes.routes() {
                let untyped = route.untyped_placeholders();
                if !untyped.is_empty() {
                    println!(
                        "route {:?}: untyped key inputs {}: on a guarded method a value that common frameworks read as a number or UUID spelled another way (042, +42, upper-case UUIDs) is refused; declare `:int` or `:uuid` to key every spelling as one, or `:str` for plain strings",
                        route.name,
                        untyped.join(", ")
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
