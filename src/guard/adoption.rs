//! The gateway's local record of the store it adopted (`{state_dir}/adopted-store.json`), kept
//! outside the store so that a store which lost everything, its identity included, is noticed.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::cache::MarkCache;
use super::trust::StoreTrust;
use crate::store::{FenceStore, StoreError, StoreIdentity};

const RECORD_FILE: &str = "adopted-store.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptionRecord {
    pub store_id: String,
    /// Unique per adoption: a gateway that stopped trusting its store trusts it again only under
    /// a newer adoption than the one in force when it stopped (no clock involved).
    #[serde(default)]
    pub adoption_id: String,
    /// When the store was adopted, in milliseconds since the epoch (for people reading the file).
    pub adopted_at_ms: u64,
}

impl AdoptionRecord {
    pub fn now(store_id: &str) -> AdoptionRecord {
        AdoptionRecord {
            store_id: store_id.to_owned(),
            adoption_id: crate::store::new_store_id(),
            adopted_at_ms: millis(SystemTime::now()),
        }
    }
}

/// How the store found compares with the adoption record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The adopted store.
    Trusted,
    /// No record yet (first start, or a new replica joining): adopt what is there.
    AdoptNow,
    /// The store had no identity and just got a new one: it lost its data.
    Forgotten { adopted: String },
    /// A store with another identity than the adopted one.
    Foreign { adopted: String, found: String },
}

impl Verdict {
    pub fn reason(&self) -> Option<String> {
        match self {
            Verdict::Trusted | Verdict::AdoptNow => None,
            Verdict::Forgotten { adopted } => Some(format!(
                "the store has lost its identity record (it was wiped, dropped or replaced by a new one); this gateway adopted store {adopted}"
            )),
            Verdict::Foreign { adopted, found } => Some(format!(
                "the store is {found}, not the store {adopted} this gateway adopted"
            )),
        }
    }
}

pub fn judge(record: Option<&AdoptionRecord>, identity: &StoreIdentity) -> Verdict {
    match record {
        None => Verdict::AdoptNow,
        Some(record) if record.store_id == identity.id => Verdict::Trusted,
        Some(record) if identity.created => Verdict::Forgotten {
            adopted: record.store_id.clone(),
        },
        Some(record) => Verdict::Foreign {
            adopted: record.store_id.clone(),
            found: identity.id.clone(),
        },
    }
}

/// Compares the store with this gateway's adoption record and sets `trust` accordingly: adopts a
/// store when there is no record yet, distrusts a store that forgot or is foreign, and trusts
/// again after an operator adopted the store (later than the distrust). Run at start and then
/// periodically, so a store wiped while the gateway runs is noticed too.
pub async fn check(
    store: &dyn FenceStore,
    state_dir: &Path,
    trust: &StoreTrust,
    cache: &MarkCache,
) -> Result<(), StoreError> {
    let identity = store.identity().await?;
    let record = read(state_dir).map_err(|e| StoreError::Setup {
        backend: store.backend(),
        detail: format!("reading {}: {e}", record_path(state_dir).display()),
    })?;
    let verdict = judge(record.as_ref(), &identity);
    let adoption = record
        .as_ref()
        .map(|r| r.adoption_id.as_str())
        .unwrap_or_default();
    match (&verdict, trust.is_trusted()) {
        (Verdict::AdoptNow, true) => {
            let record = AdoptionRecord::now(&identity.id);
            write(state_dir, &record).map_err(|e| StoreError::Setup {
                backend: store.backend(),
                detail: format!("writing {}: {e}", record_path(state_dir).display()),
            })?;
            trust.note_adoption(&record.adoption_id);
            store.expect_identity(&identity.id);
            tracing::info!(store = %identity.id, created = identity.created, "adopted the store");
        }
        (Verdict::Trusted, true) => {
            trust.note_adoption(adoption);
            store.expect_identity(&identity.id);
        }
        (Verdict::Trusted, false) if trust.adopted_since_distrust(adoption) => {
            store.expect_identity(&identity.id);
            cache.clear();
            trust.note_adoption(adoption);
            trust.restore();
        }
        (Verdict::Forgotten { .. } | Verdict::Foreign { .. }, trusted) => {
            if trusted {
                // Only an adoption newer than this one restores trust.
                trust.note_adoption(adoption);
            }
            if let Some(reason) = verdict.reason() {
                trust.distrust(reason);
            }
        }
        _ => {}
    }
    Ok(())
}

/// `fencegate store adopt`: records the store's current identity as the one this gateway trusts.
pub async fn adopt(store: &dyn FenceStore, state_dir: &Path) -> Result<StoreIdentity, StoreError> {
    let identity = store.identity().await?;
    write(state_dir, &AdoptionRecord::now(&identity.id)).map_err(|e| StoreError::Setup {
        backend: store.backend(),
        detail: format!("writing {}: {e}", record_path(state_dir).display()),
    })?;
    Ok(identity)
}

pub fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(RECORD_FILE)
}

/// Reads the record; `Ok(None)` when there is none yet.
pub fn read(state_dir: &Path) -> std::io::Result<Option<AdoptionRecord>> {
    let path = record_path(state_dir);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the record durably (temporary file, fsync, rename).
pub fn write(state_dir: &Path, record: &AdoptionRecord) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let path = record_path(state_dir);
    let temporary = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, &path)
}

fn millis(moment: SystemTime) -> u64 {
    moment
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str, created: bool) -> StoreIdentity {
        StoreIdentity {
            id: id.to_owned(),
            created,
        }
    }

    #[test]
    fn verdicts() {
        let record = AdoptionRecord::now("a");
        assert_eq!(judge(None, &identity("a", true)), Verdict::AdoptNow);
        assert_eq!(judge(None, &identity("a", false)), Verdict::AdoptNow);
        assert_eq!(
            judge(Some(&record), &identity("a", false)),
            Verdict::Trusted
        );
        assert!(matches!(
            judge(Some(&record), &identity("b", true)),
            Verdict::Forgotten { .. }
        ));
        assert!(matches!(
            judge(Some(&record), &identity("b", false)),
            Verdict::Foreign { .. }
        ));
    }

    #[test]
    fn records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let record = AdoptionRecord::now("x");
        write(dir.path(), &record).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(record));
    }
}
