//! Reloading routes without a restart: the current route table sits behind a lock held only to
//! clone an `Arc`, and the reloader re-reads the file, validates it whole and swaps the table in
//! one step. In-flight requests finish on the route they matched; an invalid file changes nothing.
//! The listeners' TLS certificates are re-read in the same step.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::authority::Authorities;
use crate::compiled::Compiled;
use crate::config::{Config, ConfigError, RestartSections, RESTART_SECTIONS};
use crate::descriptors;
use crate::metrics::Metrics;
use crate::proxy::UpstreamSlots;
use crate::route::RouteTable;
use crate::tls::ListenerTls;

/// The route table new requests are matched against. A table is installed here, at start and
/// on every reload, in one way: its routes are bound to the registry's series and given the owner
/// of their advance before it serves.
pub struct RouteSource {
    current: RwLock<Arc<RouteTable>>,
    metrics: Arc<Metrics>,
    /// The store takes a key's cross-replica turn and advances its mark in one step (PostgreSQL,
    /// Redis and etcd do), so serialized routes leave their advance to the gate.
    turns_advance: bool,
}

impl RouteSource {
    pub fn new(table: RouteTable, metrics: Arc<Metrics>, turns_advance: bool) -> RouteSource {
        let source = RouteSource {
            current: RwLock::new(Arc::new(RouteTable::default())),
            metrics,
            turns_advance,
        };
        source.replace(table);
        source
    }

    /// The table in force (a poisoned lock still holds a complete table: swaps are one store).
    pub fn current(&self) -> Arc<RouteTable> {
        match self.current.read() {
            Ok(table) => Arc::clone(&table),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn replace(&self, table: RouteTable) {
        self.metrics.bind(&table);
        table.install_owners(self.turns_advance);
        let table = Arc::new(table);
        match self.current.write() {
            Ok(mut current) => *current = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
    }
}

/// What a successful reload applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    pub routes: usize,
    /// Listener certificates re-read from their files.
    pub certificates: usize,
    /// Sections the file changes since the gateway started that only a restart applies.
    pub restart_required: Vec<&'static str>,
}

/// Starts the lock authority of every route of `routes` that has one, and stops the rest.
pub fn start_authorities(authorities: &Authorities, routes: &RouteTable) {
    authorities.start_all(routes.routes().filter_map(|route| {
        let settings = route.fence.authority.as_ref()?;
        Some((route.name.as_str(), settings, route.fence.compare))
    }));
}

/// Re-reads the configuration file and swaps in its routes. Only `[[routes]]` (and listener
/// certificates) are reloaded; changes to `[server]`, `[store]`, `[admin]` and `[telemetry]` need
/// a restart, and each reload names those the file changed since the gateway started.
pub struct Reloader {
    path: Option<PathBuf>,
    routes: Arc<RouteSource>,
    metrics: Arc<Metrics>,
    capacity: Option<Capacity>,
    /// The listeners whose certificate, key and client CA are re-read from the files the
    /// running configuration names.
    certificates: Vec<Arc<ListenerTls>>,
    /// The lock authorities, started and stopped to match the reloaded routes.
    authorities: Option<Arc<Authorities>>,
    /// The restart-only sections as the gateway started with them.
    started: Option<RestartSections>,
}

/// What a reload's upstream caps are checked against: the running configuration (whose
/// `[server]`, `[admin]` and `[store]` stay in force), its upstream slots and the open-file limit.
struct Capacity {
    running: Config,
    slots: Arc<UpstreamSlots>,
    file_limit: u64,
}

impl Reloader {
    pub fn new(path: Option<PathBuf>, routes: Arc<RouteSource>, metrics: Arc<Metrics>) -> Reloader {
        Reloader {
            path,
            routes,
            metrics,
            capacity: None,
            certificates: Vec::new(),
            authorities: None,
            started: None,
        }
    }

    /// Reloads compare the file's restart-only sections with `started`, those in force.
    pub fn with_started_sections(mut self, started: RestartSections) -> Reloader {
        self.started = Some(started);
        self
    }

    /// Reloads also start the lock authorities of new routes and stop those of removed ones.
    pub fn with_authorities(mut self, authorities: Option<Arc<Authorities>>) -> Reloader {
        self.authorities = authorities;
        self
    }

    /// Reloads also re-read these listeners' TLS files; connections already open keep theirs.
    pub fn with_certificates(mut self, listeners: Vec<Arc<ListenerTls>>) -> Reloader {
        self.certificates = listeners;
        self
    }

    /// Reloaded routes' upstream caps must fit `file_limit` beside the running caps, and are put
    /// in force on `slots`.
    pub fn with_descriptor_check(
        mut self,
        running: Config,
        slots: Arc<UpstreamSlots>,
        file_limit: u64,
    ) -> Reloader {
        self.capacity = Some(Capacity {
            running,
            slots,
            file_limit,
        });
        self
    }

    /// Reloads; `Err` says why the old routes stay in force.
    pub fn reload(&self) -> Result<ReloadReport, String> {
        let outcome = self.try_reload();
        let label = if outcome.is_ok() { "ok" } else { "error" };
        self.metrics.reloads.with_label_values(&[label]).inc();
        match &outcome {
            Ok(report) => {
                for section in RESTART_SECTIONS {
                    let waiting = report.restart_required.contains(&section);
                    self.metrics
                        .restart_required
                        .with_label_values(&[section])
                        .set(i64::from(waiting));
                }
                tracing::info!(
                    routes = report.routes,
                    certificates = report.certificates,
                    "configuration reloaded"
                );
                if !report.restart_required.is_empty() {
                    let sections = report.restart_required.join(", ");
                    tracing::warn!(
                        %sections,
                        "the configuration changes these sections, which a reload does not apply: restart to apply them"
                    );
                }
            }
            Err(error) => {
                tracing::error!(%error, "reload failed; the previous configuration stays in force")
            }
        }
        outcome
    }

    fn try_reload(&self) -> Result<ReloadReport, String> {
        let path = self
            .path
            .as_ref()
            .ok_or("this gateway was not started from a configuration file")?;
        let text = std::fs::read_to_string(path).map_err(|source| {
            ConfigError::Read {
                file: path.clone(),
                source,
            }
            .to_string()
        })?;
        let Compiled {
            config,
            routes: table,
            ..
        } = Compiled::parse(&text, path).map_err(|e| e.to_string())?;
        let restart_required = self
            .started
            .as_ref()
            .map(|started| started.changed_in(&RestartSections::parse(&text)))
            .unwrap_or_default();
        if let Some(capacity) = &self.capacity {
            let caps = capacity.slots.caps_for(&config.routes);
            let mut running = capacity.running.clone();
            running.routes = config.routes.clone();
            descriptors::check(descriptors::Need::of(&running, &caps), capacity.file_limit)
                .map_err(|e| e.to_string())?;
            capacity.slots.apply(&caps);
        }
        // Before the routes change: a certificate that does not load leaves everything as it was
        // (a listener already reloaded keeps its new, valid certificate).
        for listener in &self.certificates {
            listener.reload().map_err(|e| {
                format!(
                    "TLS certificate {}: {e}; routes were not reloaded",
                    listener.cert_path().display()
                )
            })?;
        }
        let routes = config.routes.len();
        self.routes.replace(table);
        if let Some(authorities) = &self.authorities {
            start_authorities(authorities, &self.routes.current());
        }
        Ok(ReloadReport {
            routes,
            certificates: self.certificates.len(),
            restart_required,
        })
    }
}
