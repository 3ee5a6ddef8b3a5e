//! Open file descriptors: at start the soft `RLIMIT_NOFILE` is raised to the hard limit, and every
//! configured cap that costs descriptors — client connections, admin connections, each
//! upstream's connections, the store's connections — must fit in it with a reserve to spare, so
//! that the caps (which answer 503) always bite before the process could run out (EMFILE).

use std::collections::HashMap;

use crate::config::{Config, StoreConfig};

/// Descriptors kept for everything no cap counts: the listeners, each serving thread's runtime
/// (epoll, wake-up pipe), the log, the state directory's lock, the embedded store's files, the
/// connections being refused (64 data plane, 16 admin) and the upstream connections still
/// closing after a cap's slot was handed on.
pub const RESERVE: u64 = 256;

/// The descriptor limit, as raised, or what could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit to the hard one and returns both (soft as it now is).
pub fn raise_to_hard() -> std::io::Result<Limit> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let current = getrlimit(Resource::Nofile);
    let hard = current.maximum;
    if current.current != hard {
        let raised = rustix::process::Rlimit {
            current: hard,
            maximum: hard,
        };
        setrlimit(Resource::Nofile, raised).map_err(std::io::Error::from)?;
    }
    let now = getrlimit(Resource::Nofile);
    Ok(Limit {
        soft: now.current.unwrap_or(u64::MAX),
        hard: now.maximum.unwrap_or(u64::MAX),
    })
}

/// What the configured caps need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub client_connections: u64,
    pub admin_connections: u64,
    pub upstream_connections: u64,
    pub store_connections: u64,
}

impl Need {
    /// The caps of `config`, with `upstream_caps` (each upstream's, by `host:port`).
    pub fn of(config: &Config, upstream_caps: &HashMap<String, usize>) -> Need {
        let workers = config.server.worker_count() as u64;
        let store_connections = match &config.store {
            // A pool, plus on each serving thread its batch connections and its turn holder,
            // plus the turn listener.
            StoreConfig::Postgres(pg) => {
                u64::from(pg.max_connections) + workers * (pg.batches_in_flight as u64 + 1) + 2
            }
            // A writer and a reader connection, and one per serving thread at most.
            StoreConfig::Redis(_) => workers + 4,
            // Pooled HTTP connections: the batches of each serving thread, the reads, the turns
            // and the watches.
            StoreConfig::Etcd(_) => workers * 2 + 8,
            // SQLite: the database, its WAL and shared memory, per pooled connection.
            StoreConfig::Embedded(_) => 16,
        };
        Need {
            client_connections: config.server.max_connections as u64,
            admin_connections: config
                .admin
                .as_ref()
                .map_or(0, |a| a.max_connections as u64),
            upstream_connections: upstream_caps.values().map(|&c| c as u64).sum(),
            store_connections,
        }
    }

    pub fn total(&self) -> u64 {
        self.client_connections
            + self.admin_connections
            + self.upstream_connections
            + self.store_connections
            + RESERVE
    }
}

/// The caps do not fit the descriptor limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "the configured caps need {total} open files but the limit is {limit} (RLIMIT_NOFILE, raised to its hard limit): \
     server.max_connections {clients} + admin.max_connections {admin} + max_upstream_connections over all upstreams {upstreams} \
     + store connections {store} + a reserve of {reserve}; lower those caps or raise the hard limit (ulimit -Hn, LimitNOFILE=)",
    total = need.total(),
    clients = need.client_connections,
    admin = need.admin_connections,
    upstreams = need.upstream_connections,
    store = need.store_connections,
    reserve = RESERVE
)]
pub struct Shortfall {
    pub need: Need,
    pub limit: u64,
}

/// Whether `need` fits in `limit`.
pub fn check(need: Need, limit: u64) -> Result<(), Shortfall> {
    if need.total() <= limit {
        Ok(())
    } else {
        Err(Shortfall { need, limit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(clients: u64, upstreams: u64) -> Need {
        Need {
            client_connections: clients,
            admin_connections: 64,
            upstream_connections: upstreams,
            store_connections: 16,
        }
    }

    #[test]
    fn caps_that_fit_pass_and_the_shortfall_names_every_number() {
        assert!(check(need(600, 64), 1024).is_ok());
        let refused = check(need(10_000, 256), 1024).expect_err("does not fit");
        let message = refused.to_string();
        for figure in ["10592", "1024", "10000", "256", "64", "16"] {
            assert!(message.contains(figure), "{figure} in {message}");
        }
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise_to_hard().expect("rlimit");
        assert_eq!(limit.soft, limit.hard);
    }
}
