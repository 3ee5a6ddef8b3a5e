//! The lock service a route's tokens come from, followed while the gateway runs
//! (`[routes.fence.authority]`, docs/design.md §2.4). A grant raises the resource's mark to the
//! new holder's token at once, an ended lease raises it past the ended holder's, and with
//! `require_live_lease` a write must carry the current holder's token.
//!
//! `mapping.rs`: lock names ↔ resource keys; `settings.rs`: the table compiled; `view.rs`: the
//! holders as last seen; `shared.rs`: that view with its sync state; `source.rs`: what a lock
//! service offers; `etcd.rs`, `postgres.rs`, `zookeeper.rs`: the services; `claims.rs`: changes to marks;
//! `confirms.rs`: batched linearizable reads.

// With a lock service left out of the build (Cargo features `etcd`, `postgres`, `zookeeper`),
// what only it feeds the watch with is left unused rather than written twice.
#![cfg_attr(
    not(all(feature = "etcd", feature = "postgres", feature = "zookeeper")),
    allow(dead_code)
)]

mod claims;
mod confirms;
#[cfg(feature = "etcd")]
mod etcd;
pub mod mapping;
#[cfg(feature = "postgres")]
mod postgres;
pub mod settings;
mod shared;
mod source;
pub mod view;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub use claims::MarkRaiser;
pub use mapping::{LockMapping, MappingError};
pub use settings::{AuthoritySettings, Service};

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus::{IntCounterVec, IntGaugeVec};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::config::{Compare, OnAuthorityUnavailable};
use confirms::ConfirmAsk;
use shared::{Gauges, Shared};
use source::{Feed, LockSource};
use view::Seen;

/// The authority metrics, created by the registry that exports them.
#[derive(Clone)]
pub struct AuthorityMetrics {
    /// `fencegate_authority_up{route}`: 1 while the watch is in sync.
    pub up: IntGaugeVec,
    /// `fencegate_authority_events_total{route, event}`: grants and ended leases seen.
    pub events: IntCounterVec,
    /// `fencegate_authority_checks_total{route, outcome}`.
    pub checks: IntCounterVec,
}

/// Why the authority refused a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityRefusal {
    /// The token's lease ended, or it is not the lock's current holder (`holder`, if any).
    LeaseEnded { holder: Option<u64> },
    /// The gateway cannot tell: the watch is down, or a confirm failed.
    Unavailable { detail: String },
}

/// How a write passed the authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// Checked against the lock service.
    Checked,
    /// The lock service could not be consulted and the route falls back to the marks alone.
    Plain,
}

/// Every route's running authority, started on first use on the runtime it was created on.
pub struct Authorities {
    runtime: tokio::runtime::Handle,
    marks: Arc<dyn MarkRaiser>,
    metrics: AuthorityMetrics,
    running: RwLock<HashMap<String, Arc<Authority>>>,
}

/// One route's authority: its settings, the watch's state, and the tasks following it.
pub struct Authority {
    route: String,
    settings: Arc<AuthoritySettings>,
    compare: Compare,
    shared: Arc<Shared>,
    confirms: mpsc::Sender<ConfirmAsk>,
    tasks: Vec<AbortHandle>,
    metrics: AuthorityMetrics,
}

/// What `/readyz` and `/admin/authorities` say of one authority.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorityStatus {
    pub route: String,
    pub kind: &'static str,
    pub in_sync: bool,
    /// Whether the route refuses fenced writes while out of sync.
    pub fails_closed: bool,
    /// The lock service's revision the view reflects (etcd's revision, ZooKeeper's zxid).
    pub revision: i64,
    pub holders: usize,
    pub error: Option<String>,
}

impl Authorities {
    /// The registry; followers run on `runtime`, marks are raised through `marks`.
    pub fn new(
        runtime: tokio::runtime::Handle,
        marks: Arc<dyn MarkRaiser>,
        metrics: AuthorityMetrics,
    ) -> Arc<Authorities> {
        Arc::new(Authorities {
            runtime,
            marks,
            metrics,
            running: RwLock::new(HashMap::new()),
        })
    }

    /// `route`'s authority, started now if it is not running with these settings.
    pub fn get(
        &self,
        route: &str,
        settings: &Arc<AuthoritySettings>,
        compare: Compare,
    ) -> Arc<Authority> {
        let same = |a: &Arc<Authority>| {
            (Arc::ptr_eq(&a.settings, settings) || a.settings == *settings) && a.compare == compare
        };
        if let Some(found) = self
            .running
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(route)
            .filter(|a| same(a))
        {
            return Arc::clone(found);
        }
        let mut running = self.running.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = running.get(route).filter(|a| same(a)) {
            return Arc::clone(found);
        }
        let started = Arc::new(self.start(route, settings, compare));
        if let Some(old) = running.insert(route.to_owned(), Arc::clone(&started)) {
            old.stop();
        }
        started
    }

    /// Starts the authority of every route in `routes` that has one (at start and after a
    /// reload), and stops those of routes that no longer do.
    pub fn start_all<'a>(
        &self,
        routes: impl Iterator<Item = (&'a str, &'a Arc<AuthoritySettings>, Compare)>,
    ) {
        let mut wanted = Vec::new();
        for (route, settings, compare) in routes {
            self.get(route, settings, compare);
            wanted.push(route.to_owned());
        }
        let mut running = self.running.write().unwrap_or_else(PoisonError::into_inner);
        running.retain(|route, authority| {
            let keep = wanted.contains(route);
            if !keep {
                authority.stop();
            }
            keep
        });
    }

    pub fn statuses(&self) -> Vec<AuthorityStatus> {
        let mut statuses: Vec<AuthorityStatus> = self
            .running
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|a| a.status())
            .collect();
        statuses.sort_by(|a, b| a.route.cmp(&b.route));
        statuses
    }

    /// Stops every follower.
    pub fn close(&self) {
        for authority in self
            .running
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, a)| a)
        {
            authority.stop();
        }
    }

    fn start(&self, route: &str, settings: &Arc<AuthoritySettings>, compare: Compare) -> Authority {
        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let gauges = Gauges {
            up: self.metrics.up.with_label_values(&[route]),
            grants: self.metrics.events.with_label_values(&[route, "grant"]),
            ends: self.metrics.events.with_label_values(&[route, "end"]),
        };
        let shared = Arc::new(Shared::new(changes_tx, gauges));
        let (confirm_tx, confirm_rx) = mpsc::channel(4096);
        let _entered = self.runtime.enter();
        let source: Arc<dyn LockSource> = match &settings.service {
            #[cfg(feature = "etcd")]
            Service::Etcd { client, password } => {
                match etcd::EtcdLocks::new(client, password.clone(), settings) {
                    Ok(source) => Arc::new(source),
                    Err(error) => Arc::new(source::Broken(error)),
                }
            }
            #[cfg(feature = "postgres")]
            Service::Postgres {
                url,
                table,
                poll_interval,
            } => match postgres::PostgresLeases::new(url, table, *poll_interval, settings) {
                Ok(source) => Arc::new(source),
                Err(error) => Arc::new(source::Broken(error)),
            },
            #[cfg(feature = "zookeeper")]
            Service::Zookeeper {
                hosts,
                token,
                session_timeout,
                digest,
            } => Arc::new(zookeeper::ZookeeperLocks::new(
                hosts,
                *token,
                *session_timeout,
                digest.as_ref().map(|d| d.0.clone()),
                settings,
            )),
            // Left out of this build: the configuration check refuses such a route first.
            #[cfg(not(all(feature = "etcd", feature = "postgres", feature = "zookeeper")))]
            _ => Arc::new(source::Broken(crate::config::not_built_message(
                &format!("{} lock authority", settings.kind()),
                settings.kind(),
            ))),
        };
        let feed = Feed(Arc::clone(&shared) as Arc<dyn source::FeedSink>);
        let tasks = vec![
            self.runtime
                .spawn(Arc::clone(&source).follow(feed))
                .abort_handle(),
            self.runtime
                .spawn(claims::raise_marks(
                    changes_rx,
                    Arc::clone(&self.marks),
                    Arc::clone(&shared),
                    compare,
                ))
                .abort_handle(),
            self.runtime
                .spawn(confirms::confirm_batches(
                    confirm_rx,
                    source,
                    settings.request_timeout,
                ))
                .abort_handle(),
        ];
        tracing::info!(route, kind = settings.kind(), "lock authority: following");
        Authority {
            route: route.to_owned(),
            settings: Arc::clone(settings),
            compare,
            shared,
            confirms: confirm_tx,
            tasks,
            metrics: self.metrics.clone(),
        }
    }
}

impl Authority {
    /// Checks `token` for `resource` against the lock service as the route's settings ask.
    pub async fn check(&self, resource: &str, token: u64) -> Result<Passed, AuthorityRefusal> {
        let outcome = self.decide(resource, token).await;
        let label = match &outcome {
            Ok(Passed::Checked) => "passed",
            Ok(Passed::Plain) => "plain",
            Err(AuthorityRefusal::LeaseEnded { .. }) => "lease_ended",
            Err(AuthorityRefusal::Unavailable { .. }) => "unavailable",
        };
        self.metrics
            .checks
            .with_label_values(&[self.route.as_str(), label])
            .inc();
        outcome
    }

    async fn decide(&self, resource: &str, token: u64) -> Result<Passed, AuthorityRefusal> {
        if !self.shared.in_sync() {
            let detail = self
                .shared
                .last_error()
                .unwrap_or_else(|| "the watch is not in sync".to_owned());
            return self.unavailable(detail);
        }
        let (seen, lock) = {
            let view = self
                .shared
                .view
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            let lock = view.holder(resource).map(|h| h.lock.clone());
            (view.look(resource, token), lock)
        };
        let confirm = match seen {
            Seen::Ended { holder } => return Err(AuthorityRefusal::LeaseEnded { holder }),
            Seen::Holder => self.settings.strict,
            Seen::Unknown => self.settings.require_live_lease,
        };
        if !confirm {
            return Ok(Passed::Checked);
        }
        let Some(lock) = lock.or_else(|| self.settings.mapping.lock_of(resource)) else {
            // No lock of this authority guards the key: no one can hold it.
            return Err(AuthorityRefusal::LeaseEnded { holder: None });
        };
        match self.confirm(lock).await {
            Ok(Some(holder)) if holder == token => Ok(Passed::Checked),
            Ok(holder) => Err(AuthorityRefusal::LeaseEnded { holder }),
            Err(detail) => self.unavailable(detail),
        }
    }

    /// Who holds `lock`, by a linearizable read batched with other requests'.
    async fn confirm(&self, lock: String) -> Result<Option<u64>, String> {
        let (answer, answered) = oneshot::channel();
        self.confirms
            .try_send(ConfirmAsk { lock, answer })
            .map_err(|_| "too many confirms waiting for the lock service".to_owned())?;
        answered
            .await
            .map_err(|_| "the confirm was dropped (shutting down)".to_owned())?
    }

    fn unavailable(&self, detail: String) -> Result<Passed, AuthorityRefusal> {
        match self.settings.on_unavailable {
            OnAuthorityUnavailable::FailClosed => Err(AuthorityRefusal::Unavailable { detail }),
            OnAuthorityUnavailable::Plain => Ok(Passed::Plain),
        }
    }

    pub fn status(&self) -> AuthorityStatus {
        AuthorityStatus {
            route: self.route.clone(),
            kind: self.settings.kind(),
            in_sync: self.shared.in_sync(),
            fails_closed: self.settings.on_unavailable == OnAuthorityUnavailable::FailClosed,
            revision: self.shared.revision(),
            holders: self
                .shared
                .view
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .holders(),
            error: self.shared.last_error(),
        }
    }

    fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        self.stop();
    }
}
