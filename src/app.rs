//! Wiring a configuration into a running gateway: open the store and check it is the one this
//! gateway adopted, compile the routes, serve until the shutdown future resolves, then close the
//! store.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::authority::Authorities;
use crate::body::budget::MemoryBudget;
use crate::compiled::{Compiled, ListenerSettings};
use crate::config::{Config, RestartSections};
use crate::descriptors;
use crate::fence::StoreMarks;
use crate::gate::Gates;
use crate::gateway::{Gateway, Reporting, SharedLimits};
use crate::guard::{adoption, CheckedStore, MarkCache, Replica, StoreTrust};
use crate::metrics::Metrics;
use crate::proxy::UpstreamSlots;
use crate::reload::{start_authorities, Reloader, RouteSource};
use crate::route::{CompiledRoute, RouteTable};
use crate::server::Stopping;
use crate::store::intents::NoIntentStore;
use crate::store::{self, AdvanceAndBegin, FenceStore, IntentStore, StoreError};
use crate::telemetry::{AccessLog, SpanExport, Telemetry};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("admin: {0}")]
    Admin(String),
    #[error("state directory {dir}: {source}")]
    StateDir {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read or raise the open-file limit: {0}")]
    FileLimit(#[source] std::io::Error),
    #[error(transparent)]
    Descriptors(#[from] descriptors::Shortfall),
}

/// A gateway ready to serve: its store is open and checked, its routes compiled.
pub struct App {
    config: Config,
    routes: Arc<RouteSource>,
    /// The listeners' TLS settings, reloaded with the routes.
    listeners: ListenerSettings,
    /// The file the configuration came from, for reloads.
    config_path: Option<std::path::PathBuf>,
    /// The sections of that file only a restart applies, as they were at start.
    started_sections: RestartSections,
    /// The store as opened: only adoption and the identity watch talk to it directly.
    backend: Arc<dyn FenceStore>,
    /// The same store behind the gateway's cache and trust check: what every layer uses.
    guarded: Arc<CheckedStore>,
    cache: Arc<MarkCache>,
    trust: Arc<StoreTrust>,
    gates: Gates,
    intents: Option<Arc<dyn IntentStore>>,
    metrics: Arc<Metrics>,
    /// Bound ahead of `serve` by `bind_admin` (tests learn the port that way).
    admin_listener: Option<TcpListener>,
    /// This gateway's name as a holder of key turns, locked for as long as it runs.
    replica: Option<Replica>,
    /// The memory budget, upstream slots and body pause every serving thread shares.
    limits: SharedLimits,
    /// The open-file limit the caps were checked against (again on each reload).
    file_limit: u64,
    /// The routes' lock authorities, followed while serving (none when built outside a
    /// runtime: routes with an authority then refuse their fenced writes).
    authorities: Option<Arc<Authorities>>,
    /// Set when the gateway is asked to stop, for `/readyz`.
    stopping: Stopping,
}

/// Raises the open-file limit, and checks that every cap of `config` fits in it.
fn check_descriptors(config: &Config, slots: &UpstreamSlots) -> Result<u64, StartError> {
    let limit = descriptors::raise_to_hard().map_err(StartError::FileLimit)?;
    let caps = slots.caps_for(&config.routes);
    descriptors::check(descriptors::Need::of(config, &caps), limit.soft)?;
    slots.apply(&caps);
    Ok(limit.soft)
}

impl App {
    /// Compiles the routes, opens the store the configuration names and checks its identity
    /// against this gateway's adoption record.
    pub async fn build(compiled: Compiled) -> Result<App, StartError> {
        let Compiled {
            config,
            routes,
            listeners,
        } = compiled;
        let slots = Arc::new(UpstreamSlots::new(&config.server));
        let file_limit = check_descriptors(&config, &slots)?;
        if let Some(admin) = &config.admin {
            admin_token(admin)?;
        }
        let replica =
            Replica::claim(&config.server.state_dir).map_err(|source| StartError::StateDir {
                dir: config.server.state_dir.clone(),
                source,
            })?;
        let opened = store::open(&config.store, &replica.id).await?;
        let gates = Gates::new(opened.turns.clone(), config.store.turn_margin());
        let mut app = App::assemble(
            config,
            (routes, listeners),
            (opened.fences, opened.combined),
            Some(opened.intents),
            gates,
            (slots, file_limit),
        );
        app.replica = Some(replica);
        adoption::check(
            app.backend.as_ref(),
            &app.config.server.state_dir,
            &app.trust,
            &app.cache,
        )
        .await?;
        tracing::info!(
            backend = app.backend.backend(),
            routes = app.config.routes.len(),
            trusted = app.trust.is_trusted(),
            "store open"
        );
        Ok(app)
    }

    /// Like [`App::build`], but on a fence store the caller opened (the `[store]` table and the
    /// adoption check are skipped; routes with idempotency answer 503).
    pub fn with_store(compiled: Compiled, backend: Arc<dyn FenceStore>) -> Result<App, StartError> {
        let Compiled {
            config,
            routes,
            listeners,
        } = compiled;
        let slots = Arc::new(UpstreamSlots::new(&config.server));
        let file_limit = check_descriptors(&config, &slots)?;
        Ok(App::assemble(
            config,
            (routes, listeners),
            (backend, None),
            None,
            Gates::local_only(),
            (slots, file_limit),
        ))
    }

    fn assemble(
        config: Config,
        (routes, listeners): (RouteTable, ListenerSettings),
        (backend, combined): (Arc<dyn FenceStore>, Option<Arc<dyn AdvanceAndBegin>>),
        intents: Option<Arc<dyn IntentStore>>,
        gates: Gates,
        (upstream_slots, file_limit): (Arc<UpstreamSlots>, u64),
    ) -> App {
        let cache = Arc::new(MarkCache::new(config.store.cache_capacity()));
        let trust = Arc::new(StoreTrust::default());
        let metrics = Metrics::new();
        metrics
            .buffered_bytes_limit
            .set(i64::try_from(config.server.max_buffered_bytes).unwrap_or(i64::MAX));
        let limits = SharedLimits {
            budget: MemoryBudget::new(
                config.server.max_buffered_bytes,
                config.server.buffer_wait,
                metrics.buffered_bytes.clone(),
            ),
            upstream_slots,
            body_timeout: config.server.body_timeout,
        };
        let guarded = Arc::new(CheckedStore::new(
            Arc::clone(&backend),
            combined,
            Arc::clone(&cache),
            Arc::clone(&trust),
            Arc::clone(&metrics),
        ));
        // Followed on the runtime the gateway is built on (serving threads have their own).
        let authorities = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            Authorities::new(
                runtime,
                Arc::new(StoreMarks(Arc::clone(&guarded))),
                metrics.authority.clone(),
            )
        });
        App {
            authorities,
            config,
            routes: Arc::new(RouteSource::new(
                routes,
                Arc::clone(&metrics),
                gates.cross_replica.is_some(),
            )),
            listeners,
            config_path: None,
            started_sections: RestartSections::parse(""),
            backend,
            guarded,
            cache,
            trust,
            gates,
            intents,
            metrics,
            admin_listener: None,
            replica: None,
            limits,
            file_limit,
            stopping: Stopping::default(),
        }
    }

    /// The flag that turns `/readyz` to 503 once set: set it when the gateway is asked to stop,
    /// `drain_delay` before the `shutdown` future handed to [`App::serve`] resolves.
    pub fn stopping(&self) -> Stopping {
        self.stopping.clone()
    }

    /// `[server] drain_delay`: how long the listener keeps serving once [`App::stopping`] is set.
    pub fn drain_delay(&self) -> std::time::Duration {
        self.config.server.drain_delay
    }

    /// A compiled route, for reading its counters.
    pub fn route(&self, name: &str) -> Option<Arc<CompiledRoute>> {
        self.routes.current().get(name).cloned()
    }

    /// The store as the gateway uses it (behind the cache and the trust check).
    pub fn store(&self) -> Arc<CheckedStore> {
        Arc::clone(&self.guarded)
    }

    /// The backend itself, without the gateway's cache and checks (for adopting it).
    pub fn backend(&self) -> Arc<dyn FenceStore> {
        Arc::clone(&self.backend)
    }

    /// The intent records of idempotent routes, when the store provides them.
    pub fn intents(&self) -> Option<Arc<dyn IntentStore>> {
        self.intents.clone()
    }

    /// Whether the gateway currently trusts its store.
    pub fn trust(&self) -> Arc<StoreTrust> {
        Arc::clone(&self.trust)
    }

    /// Records the file the configuration came from, so that reloads re-read it, and its text
    /// as it was at start, so that reloads name the changes only a restart applies.
    pub fn set_config_source(&mut self, path: &std::path::Path, text: &str) {
        self.config_path = Some(path.to_owned());
        self.started_sections = RestartSections::parse(text);
    }

    /// The reloader of this gateway's routes (for SIGHUP and the admin endpoint).
    pub fn reloader(&self) -> Arc<Reloader> {
        Arc::new(
            Reloader::new(
                self.config_path.clone(),
                Arc::clone(&self.routes),
                Arc::clone(&self.metrics),
            )
            .with_descriptor_check(
                self.config.clone(),
                Arc::clone(&self.limits.upstream_slots),
                self.file_limit,
            )
            .with_authorities(self.authorities.clone())
            .with_started_sections(self.started_sections.clone())
            .with_certificates(
                [&self.listeners.data, &self.listeners.admin]
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect(),
            ),
        )
    }

    /// The metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Binds the admin listener now (if `[admin]` is configured) and returns its address.
    pub async fn bind_admin(&mut self) -> Result<Option<SocketAddr>, StartError> {
        let Some(admin) = &self.config.admin else {
            return Ok(None);
        };
        let addr = admin.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })?;
        let bound = listener.local_addr().ok();
        self.admin_listener = Some(listener);
        Ok(bound)
    }

    /// Starts the admin listener's task, if `[admin]` is configured.
    async fn start_admin(&mut self) -> Result<Option<tokio::task::JoinHandle<()>>, StartError> {
        let Some(admin) = self.config.admin.clone() else {
            return Ok(None);
        };
        let token = admin_token(&admin)?;
        if self.admin_listener.is_none() {
            self.bind_admin().await?;
        }
        let Some(listener) = self.admin_listener.take() else {
            return Ok(None);
        };
        if let Ok(addr) = listener.local_addr() {
            let tls = self.listeners.admin.is_some();
            tracing::info!(%addr, tls, "admin listening");
        }
        self.serve_admin_api(listener, &admin, token).map(Some)
    }

    /// The admin API on `listener`, as a task.
    #[cfg(feature = "admin")]
    fn serve_admin_api(
        &self,
        listener: TcpListener,
        admin: &crate::config::AdminConfig,
        token: String,
    ) -> Result<tokio::task::JoinHandle<()>, StartError> {
        let state = crate::admin::AdminState {
            routes: Arc::clone(&self.routes),
            reloader: self.reloader(),
            store: Arc::clone(&self.guarded),
            intents: self.intents.clone(),
            trust: Arc::clone(&self.trust),
            metrics: Arc::clone(&self.metrics),
            listeners: self.listeners.clone(),
            authorities: self.authorities.clone(),
            token: token.into(),
            probes_require_token: admin.probes_require_token,
            stopping: self.stopping.clone(),
        };
        let router = crate::admin::router(state);
        Ok(tokio::spawn(crate::server::serve_admin(
            listener,
            router,
            admin.max_connections,
            self.listeners.admin.clone(),
            crate::server::ConnectionTimeouts::from_config(&self.config.server),
            Arc::clone(&self.metrics),
        )))
    }

    /// This build has no admin API (`check-config` refuses `[admin]` first).
    #[cfg(not(feature = "admin"))]
    fn serve_admin_api(
        &self,
        _listener: TcpListener,
        _admin: &crate::config::AdminConfig,
        _token: String,
    ) -> Result<tokio::task::JoinHandle<()>, StartError> {
        Err(StartError::Admin(crate::config::not_built_message(
            "admin listener",
            "admin",
        )))
    }

    /// Binds the configured listen address.
    pub async fn bind(&self) -> Result<TcpListener, StartError> {
        let addr = self.config.server.listen;
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    }

    /// Serves on `listener` until `shutdown` resolves, drains, and closes the store.
    pub async fn serve(mut self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        // Before the admin listener, whose `/readyz` reports them.
        if let Some(authorities) = &self.authorities {
            start_authorities(authorities, &self.routes.current());
        }
        let admin = match self.start_admin().await {
            Ok(admin) => admin,
            Err(e) => {
                tracing::error!("{e}; serving without the admin listener");
                None
            }
        };
        if let Ok(addr) = listener.local_addr() {
            let tls = self.listeners.data.is_some();
            tracing::info!(%addr, tls, "fencegate listening");
        }
        let watcher = tokio::spawn(watch_store(
            Arc::clone(&self.backend),
            self.config.server.state_dir.clone(),
            Arc::clone(&self.trust),
            Arc::clone(&self.cache),
            self.config.server.store_check_interval,
        ));
        let intents = self
            .intents
            .clone()
            .unwrap_or_else(|| Arc::new(NoIntentStore) as Arc<dyn IntentStore>);
        let pruner = tokio::spawn(prune_intents(
            Arc::clone(&intents),
            self.config.server.intent_prune_interval,
        ));
        let spans = self.config.telemetry.as_ref().and_then(|config| {
            SpanExport::start(config, tokio::runtime::Handle::current())
                .map_err(|e| tracing::error!(error = %e, "spans are not exported"))
                .ok()
                .map(Arc::new)
        });
        let telemetry = Telemetry {
            access_log: self.config.server.access_log.then(|| {
                Arc::new(AccessLog::new(
                    self.config.server.access_log_sample,
                    self.config.server.access_log_format,
                ))
            }),
            spans: spans.clone(),
        };
        // One gateway per serving thread, each with its own upstream connections.
        let gateway = || {
            Gateway::new(
                Arc::clone(&self.routes),
                Arc::clone(&self.guarded),
                self.intents.clone(),
                self.gates.clone(),
                self.limits.clone(),
                self.authorities.clone(),
                Reporting {
                    metrics: Arc::clone(&self.metrics),
                    telemetry: telemetry.clone(),
                },
            )
        };
        let workers = crate::server::serve(
            listener,
            gateway,
            shutdown,
            self.config.server.shutdown_grace,
            crate::server::ServerLimits::from_config(&self.config.server),
            self.listeners.data.clone(),
            Arc::clone(&self.metrics),
        )
        .await;
        watcher.abort();
        pruner.abort();
        if let Some(spans) = spans {
            // Off the runtime: the SDK's flush waits on its export thread, whose HTTP calls run
            // on this runtime.
            let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
        }
        if let Some(authorities) = &self.authorities {
            authorities.close();
        }
        if let Some(admin) = admin {
            admin.abort();
        }
        if let Some(gate) = &self.gates.cross_replica {
            gate.close().await;
        }
        if let Err(e) = self.guarded.close().await {
            tracing::warn!(error = %e, "closing the store failed");
        }
        // Last: pooled store connections opened while serving belong to the workers' runtimes.
        drop(workers);
        tracing::info!("fencegate stopped");
    }
}

/// The admin API's bearer token, from the file or the environment.
fn admin_token(admin: &crate::config::AdminConfig) -> Result<String, StartError> {
    admin
        .bearer_token()
        .map_err(|e| StartError::Admin(format!("admin.token: {e}")))?
        .ok_or_else(|| StartError::Admin("no token configured".to_owned()))
}

/// Re-checks the store's identity every `interval` (owned by `App::serve`, aborted on shutdown).
async fn watch_store(
    backend: Arc<dyn FenceStore>,
    state_dir: std::path::PathBuf,
    trust: Arc<StoreTrust>,
    cache: Arc<MarkCache>,
    interval: std::time::Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if let Err(e) = adoption::check(backend.as_ref(), &state_dir, &trust, &cache).await {
            tracing::debug!(error = %e, "store identity check failed; will retry");
        }
    }
}

/// Most records deleted by one prune call: bounds each call's work on the store.
const PRUNE_BATCH: usize = 1000;

/// Deletes intent records past their retention, in bounded batches (owned by `App::serve`).
async fn prune_intents(intents: Arc<dyn IntentStore>, interval: std::time::Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        loop {
            match intents
                .prune(crate::idempotency::now_ms(), PRUNE_BATCH)
                .await
            {
                Ok(pruned) if pruned == PRUNE_BATCH => continue,
                Ok(pruned) => {
                    if pruned > 0 {
                        tracing::info!(pruned, "pruned expired intent records");
                    }
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "pruning intent records failed; will retry");
                    break;
                }
            }
        }
    }
}
