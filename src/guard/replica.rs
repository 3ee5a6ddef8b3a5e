//! This gateway's name as a holder of key turns (`{state_dir}/replica-id`), kept across restarts
//! under a lock (`{state_dir}/replica.lock`) that only a running process holds. A gateway that
//! restarts after a crash takes back the turns its dead predecessor left leased — the kernel
//! closed that process's upstream connections when it died, so its forwards are over — instead of
//! waiting for their leases to lapse. While another live process holds the lock (two gateways
//! sharing a state directory), this one uses a fresh random name and takes back nothing.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::Path;

const ID_FILE: &str = "replica-id";
const LOCK_FILE: &str = "replica.lock";

/// The holder name, and the lock that makes it this process's alone (held while it lives).
#[derive(Debug)]
pub struct Replica {
    pub id: String,
    _lock: Option<File>,
}

impl Replica {
    /// Claims the state directory's replica name, or makes a fresh one when another process
    /// holds it.
    pub fn claim(state_dir: &Path) -> std::io::Result<Replica> {
        std::fs::create_dir_all(state_dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(state_dir.join(LOCK_FILE))?;
        match lock.try_lock() {
            Ok(()) => Ok(Replica {
                id: stored_id(state_dir)?,
                _lock: Some(lock),
            }),
            Err(std::fs::TryLockError::WouldBlock) => {
                tracing::warn!(dir = %state_dir.display(), "another running gateway uses this state directory; this one takes key turns under a name of its own");
                Ok(Replica::fresh())
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    /// A name no other process has used (for commands that take no turns, and tests).
    pub fn fresh() -> Replica {
        Replica {
            id: crate::store::new_store_id(),
            _lock: None,
        }
    }
}

/// The stored name, written (durably) the first time.
fn stored_id(state_dir: &Path) -> std::io::Result<String> {
    let path = state_dir.join(ID_FILE);
    let mut text = String::new();
    match File::open(&path) {
        Ok(mut file) => {
            file.read_to_string(&mut text)?;
            let id = text.trim();
            if !id.is_empty() && !id.contains(char::is_whitespace) {
                return Ok(id.to_owned());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let id = crate::store::new_store_id();
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary)?;
    file.write_all(id.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, &path)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_survives_a_restart_and_is_not_shared_with_a_live_process() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = Replica::claim(dir.path()).expect("claim");
        let second = Replica::claim(dir.path()).expect("claim");
        assert_ne!(first.id, second.id, "a live process's name was shared");
        let id = first.id.clone();
        drop(first);
        drop(second);
        let restarted = Replica::claim(dir.path()).expect("claim");
        assert_eq!(restarted.id, id, "a restarted gateway got a new name");
    }
}
