//! One serving thread's pools of HTTPS upstream connections, one per route TLS setting:
//! connections are made with the route's trust, name and client certificate, offer `h2` and
//! `http/1.1` by ALPN, and are reused like plain ones. Settings dropped by a reload drop their
//! pool with them.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustls::ClientConfig;

use super::upstream_dial::Dialer;
use super::upstream_pool::UpstreamPool;
use super::upstream_slots::CappedConnector;
use crate::tls::UpstreamTls;

/// This thread's HTTPS pools, by the settings they were built from.
pub struct TlsPools {
    pools: Mutex<Vec<(Weak<ClientConfig>, Arc<UpstreamPool>)>>,
    build: fn(Dialer) -> UpstreamPool,
    tcp: CappedConnector,
}

impl TlsPools {
    /// Pools made by `build`, connecting over `tcp`.
    pub fn new(tcp: CappedConnector, build: fn(Dialer) -> UpstreamPool) -> TlsPools {
        TlsPools {
            pools: Mutex::new(Vec::new()),
            build,
            tcp,
        }
    }

    /// The pool for `tls`, built on first use.
    pub fn pool_for(&self, tls: &UpstreamTls) -> Arc<UpstreamPool> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, pool)) = pools
            .iter()
            .find(|(config, _)| std::ptr::eq(config.as_ptr(), Arc::as_ptr(&tls.config)))
        {
            return Arc::clone(pool);
        }
        // Settings replaced by a reload are no longer used by any route.
        pools.retain(|(config, _)| config.strong_count() > 0);
        let pool = Arc::new((self.build)(Dialer::tls(self.tcp.clone(), tls)));
        pools.push((Arc::downgrade(&tls.config), Arc::clone(&pool)));
        pool
    }
}
