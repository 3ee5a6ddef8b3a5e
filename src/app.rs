//! Wiring a configuration into a running gateway: open the store, compile the routes, serve
//! until the shutdown future resolves, then close the store.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::route::{CompiledRoute, RouteError, RouteTable};
use crate::store::{self, FenceStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("route {}: field `{}`: {}", .0.route, .0.field, .0.message)]
    Route(RouteError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A gateway ready to serve: its store is open and its routes compiled.
pub struct App {
    config: Config,
    routes: Arc<RouteTable>,
    store: Arc<dyn FenceStore>,
}

impl App {
    /// Compiles the routes and opens the store the configuration names.
    pub async fn build(config: Config) -> Result<App, StartError> {
        let routes = RouteTable::compile(&config.routes).map_err(StartError::Route)?;
        let store = store::open(&config.store).await?;
        tracing::info!(
            backend = store.backend(),
            routes = config.routes.len(),
            "store open"
        );
        Ok(App::assemble(config, routes, store))
    }

    /// Like [`App::build`], but on a store the caller opened (the `[store]` table is ignored).
    pub fn with_store(config: Config, store: Arc<dyn FenceStore>) -> Result<App, StartError> {
        let routes = RouteTable::compile(&config.routes).map_err(StartError::Route)?;
        Ok(App::assemble(config, routes, store))
    }

    fn assemble(config: Config, routes: RouteTable, store: Arc<dyn FenceStore>) -> App {
        App {
            config,
            routes: Arc::new(routes),
            store,
        }
    }

    /// A compiled route, for reading its counters.
    pub fn route(&self, name: &str) -> Option<Arc<CompiledRoute>> {
        self.routes.get(name).cloned()
    }

    /// The store the gateway uses.
    pub fn store(&self) -> Arc<dyn FenceStore> {
        Arc::clone(&self.store)
    }

    /// Binds the configured listen address.
    pub async fn bind(&self) -> Result<TcpListener, StartError> {
        let addr = self.config.server.listen;
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    }

    /// Serves on `listener` until `shutdown` resolves, drains, and closes the store.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "fencegate listening");
        }
        let gateway = Gateway::new(Arc::clone(&self.routes), Arc::clone(&self.store));
        crate::server::serve(
            listener,
            gateway,
            shutdown,
            self.config.server.shutdown_grace,
        )
        .await;
        if let Err(e) = self.store.close().await {
            tracing::warn!(error = %e, "closing the store failed");
        }
        tracing::info!("fencegate stopped");
    }
}

/// Builds the gateway from `config` and serves on `listener` until `shutdown` resolves.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    App::build(config).await?.serve(listener, shutdown).await;
    Ok(())
}
