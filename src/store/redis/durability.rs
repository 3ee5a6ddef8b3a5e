//! The start-up check of the server's persistence settings: reads them with `CONFIG GET` and
//! decides whether a restart or crash could lose accepted advances, so whether to serve quietly,
//! warn or refuse.

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;
use redis::{RedisError, Value};

use super::script::server_answer;

/// What `CONFIG GET` says about persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Persistence {
    appendonly: String,
    appendfsync: String,
    save: String,
}

/// Reads the persistence settings; `Ok(Err(reason))` when the server does not allow `CONFIG`
/// (managed Redis, ACLs). A failed connection is the outer error.
pub(super) async fn read_persistence(
    connection: &mut MultiplexedConnection,
) -> Result<Result<Persistence, String>, RedisError> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for name in ["appendonly", "appendfsync", "save"] {
        pipe.cmd("CONFIG").arg("GET").arg(name);
    }
    let replies: Vec<Value> = pipe.query_async(connection).await?;
    let mut values = Vec::with_capacity(3);
    for (name, reply) in ["appendonly", "appendfsync", "save"]
        .into_iter()
        .zip(replies)
    {
        let pairs: HashMap<String, String> = match server_answer(reply) {
            Ok(reply) => match redis::from_redis_value(reply) {
                Ok(pairs) => pairs,
                Err(e) => return Ok(Err(format!("CONFIG GET {name} answered oddly: {e}"))),
            },
            Err(e) => return Ok(Err(format!("CONFIG GET {name} was refused: {e}"))),
        };
        match pairs.get(name) {
            Some(value) => values.push(value.clone()),
            None => return Ok(Err(format!("CONFIG GET {name} returned no value"))),
        }
    }
    match <[String; 3]>::try_from(values) {
        Ok([appendonly, appendfsync, save]) => Ok(Ok(Persistence {
            appendonly,
            appendfsync,
            save,
        })),
        Err(_) => Ok(Err("CONFIG GET answered too few settings".to_owned())),
    }
}

/// What to do about the server's persistence.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Durability {
    /// `appendonly yes` with `appendfsync always`: an accepted advance is on disk.
    Durable,
    /// Serve, but tell the operator what a restart or crash would lose.
    Warn(String),
    /// `require_durable` is set and the server is not durable (or would not say).
    Refuse(String),
}

/// The settings a store with `require_durable` needs.
const NEEDED: &str = "appendonly yes with appendfsync always";

/// Judges what a restart or crash of the server would do to the marks. Only an append-only file
/// synced on every write keeps every accepted advance; anything less can re-admit a stale holder.
pub(super) fn judge_durability(
    found: Result<&Persistence, &str>,
    require_durable: bool,
) -> Durability {
    let found = match found {
        Ok(found) => found,
        Err(reason) if require_durable => {
            return Durability::Refuse(format!(
            "require_durable is set but the persistence settings cannot be verified ({reason}); \
                 it needs {NEEDED}"
        ))
        }
        Err(reason) => {
            return Durability::Warn(format!(
                "cannot verify that fencing marks survive a restart of Redis ({reason}); \
                 make sure the server runs with {NEEDED}"
            ))
        }
    };
    let aof = found.appendonly.eq_ignore_ascii_case("yes");
    let fsync = found.appendfsync.to_ascii_lowercase();
    if aof && fsync == "always" {
        return Durability::Durable;
    }
    let settings = format!(
        "appendonly {}, appendfsync {}, save \"{}\"",
        found.appendonly, found.appendfsync, found.save
    );
    let risk = if aof && fsync == "everysec" {
        "a crash can lose the last second of accepted advances"
    } else if aof {
        "a crash can lose the accepted advances the OS had not yet written (up to ~30 s)"
    } else if !found.save.trim().is_empty() {
        "a restart or crash loses every advance since the last RDB snapshot"
    } else {
        "the marks do not survive a restart of Redis at all (persistence is off)"
    };
    if require_durable {
        Durability::Refuse(format!(
            "require_durable is set but the server runs with {settings}: {risk}; it needs {NEEDED}"
        ))
    } else {
        Durability::Warn(format!(
            "the server runs with {settings}: {risk}, and a lost mark re-admits stale lock \
             holders; set {NEEDED} in redis.conf (or require_durable = true to refuse such a server)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persistence(appendonly: &str, appendfsync: &str, save: &str) -> Persistence {
        Persistence {
            appendonly: appendonly.to_owned(),
            appendfsync: appendfsync.to_owned(),
            save: save.to_owned(),
        }
    }

    #[test]
    fn append_only_file_synced_always_is_durable() {
        let found = persistence("yes", "always", "");
        assert_eq!(judge_durability(Ok(&found), true), Durability::Durable);
        assert_eq!(judge_durability(Ok(&found), false), Durability::Durable);
    }

    #[test]
    fn no_persistence_at_all_warns_that_marks_do_not_survive_a_restart() {
        let found = persistence("no", "everysec", "");
        let Durability::Warn(message) = judge_durability(Ok(&found), false) else {
            panic!("expected a warning");
        };
        assert!(message.contains("do not survive a restart"), "{message}");
        assert!(message.contains("appendonly no"), "{message}");
        assert!(message.contains(NEEDED), "{message}");
    }

    #[test]
    fn require_durable_refuses_anything_but_fsync_always_naming_the_settings() {
        for (appendonly, appendfsync, save) in [
            ("no", "everysec", ""),
            ("no", "always", "3600 1"),
            ("yes", "everysec", ""),
            ("yes", "no", "3600 1"),
        ] {
            let found = persistence(appendonly, appendfsync, save);
            let Durability::Refuse(detail) = judge_durability(Ok(&found), true) else {
                panic!("{found:?} should be refused");
            };
            assert!(
                detail.contains(&format!(
                    "appendonly {appendonly}, appendfsync {appendfsync}"
                )),
                "{detail}"
            );
            assert!(detail.contains(NEEDED), "{detail}");
        }
    }

    #[test]
    fn each_weaker_setting_names_what_it_loses() {
        let cases = [
            (persistence("yes", "everysec", ""), "last second"),
            (persistence("yes", "no", ""), "not yet written"),
            (
                persistence("no", "everysec", "3600 1 300 100"),
                "RDB snapshot",
            ),
        ];
        for (found, loses) in cases {
            let Durability::Warn(message) = judge_durability(Ok(&found), false) else {
                panic!("{found:?} should warn");
            };
            assert!(message.contains(loses), "{message}");
        }
    }

    #[test]
    fn settings_that_cannot_be_read_warn_or_refuse() {
        let reason = "CONFIG GET appendonly was refused: NOPERM";
        assert!(matches!(
            judge_durability(Err(reason), false),
            Durability::Warn(m) if m.contains("cannot verify") && m.contains("NOPERM")
        ));
        assert!(matches!(
            judge_durability(Err(reason), true),
            Durability::Refuse(d) if d.contains("cannot be verified") && d.contains(NEEDED)
        ));
    }
}
