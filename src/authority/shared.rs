//! The state an authority's watch writes and its requests read: the view, whether it is in
//! sync, the revision it reached, and the changes on their way to the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use prometheus::{IntCounter, IntGauge};
use tokio::sync::mpsc;

use super::source::FeedSink;
use super::view::{AuthorityView, Change, Holder};

/// One route's authority metrics, with their labels applied.
pub(crate) struct Gauges {
    pub(crate) up: IntGauge,
    pub(crate) grants: IntCounter,
    pub(crate) ends: IntCounter,
}

pub(crate) struct Shared {
    pub(crate) view: RwLock<AuthorityView>,
    in_sync: AtomicBool,
    revision: AtomicI64,
    last_error: Mutex<Option<String>>,
    changes: mpsc::UnboundedSender<Change>,
    gauges: Gauges,
}

impl Shared {
    pub(crate) fn new(changes: mpsc::UnboundedSender<Change>, gauges: Gauges) -> Shared {
        gauges.up.set(0);
        Shared {
            view: RwLock::new(AuthorityView::default()),
            in_sync: AtomicBool::new(false),
            revision: AtomicI64::new(0),
            last_error: Mutex::new(Some("not read yet".to_owned())),
            changes,
            gauges,
        }
    }

    pub(crate) fn in_sync(&self) -> bool {
        self.in_sync.load(Ordering::Acquire)
    }

    /// The lock service's revision the view reflects (etcd; 0 elsewhere).
    pub(crate) fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn report(&self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Granted { .. } => self.gauges.grants.inc(),
                Change::Ended { .. } => self.gauges.ends.inc(),
            }
            // The claims task outlives every feed; a send fails only at shutdown.
            let _ = self.changes.send(change);
        }
    }

    fn mark_synced(&self, revision: i64) {
        self.revision.fetch_max(revision, Ordering::AcqRel);
        if !self.in_sync.swap(true, Ordering::AcqRel) {
            *self
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
            self.gauges.up.set(1);
        }
    }
}

impl FeedSink for Shared {
    fn resync(&self, holders: HashMap<String, Holder>, revision: i64) {
        let changes = self
            .view
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(holders);
        self.report(changes);
        self.mark_synced(revision);
    }

    fn apply(&self, changes: Vec<(String, Option<Holder>)>, revision: i64) {
        let changes: Vec<Change> = {
            let mut view = self.view.write().unwrap_or_else(PoisonError::into_inner);
            changes
                .into_iter()
                .filter_map(|(resource, holder)| view.set(&resource, holder))
                .collect()
        };
        self.report(changes);
        self.revision.fetch_max(revision, Ordering::AcqRel);
    }

    fn lost(&self, why: String) {
        if self.in_sync.swap(false, Ordering::AcqRel) {
            tracing::warn!(error = %why, "lock authority: lost the watch; its routes fail closed or fence by marks alone until it is back");
        }
        self.gauges.up.set(0);
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(why);
    }
}
