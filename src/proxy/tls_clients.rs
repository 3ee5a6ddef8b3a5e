//! The pooled HTTPS clients of one serving thread, one per route TLS setting: connections are
//! made with the route's trust, name and client certificate, offer `h2` and `http/1.1` by ALPN,
//! and are reused like plain ones. Settings dropped by a reload drop their client with them.

use std::sync::{Arc, Mutex, Weak};

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use rustls::ClientConfig;

use super::forward::{client_builder, http_connector};
use super::upstream_slots::{CappedConnector, UpstreamSlots};
use super::RequestBody;
use crate::tls::UpstreamTls;

/// A pooled client for one route's TLS settings.
pub type HttpsClient = Client<HttpsConnector<CappedConnector>, RequestBody>;

/// This thread's HTTPS clients, by the settings they were built from.
#[derive(Default)]
pub struct TlsClients {
    clients: Mutex<Vec<(Weak<ClientConfig>, HttpsClient)>>,
}

impl TlsClients {
    /// The client for `tls`, built on first use.
    pub fn client_for(&self, tls: &UpstreamTls, slots: &Arc<UpstreamSlots>) -> HttpsClient {
        let mut clients = match self.clients.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((_, client)) = clients
            .iter()
            .find(|(config, _)| std::ptr::eq(config.as_ptr(), Arc::as_ptr(&tls.config)))
        {
            return client.clone();
        }
        // Settings replaced by a reload are no longer used by any route.
        clients.retain(|(config, _)| config.strong_count() > 0);
        let client = build(tls, slots);
        clients.push((Arc::downgrade(&tls.config), client.clone()));
        client
    }
}

fn build(tls: &UpstreamTls, slots: &Arc<UpstreamSlots>) -> HttpsClient {
    let mut tcp = http_connector();
    // The TLS connector hands `https://` URIs to it.
    tcp.enforce_http(false);
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(ClientConfig::clone(&tls.config))
        .https_only();
    let builder = match &tls.server_name {
        Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(name.clone())),
        None => builder,
    };
    let connector = builder
        .enable_http1()
        .enable_http2()
        .wrap_connector(CappedConnector::new(tcp, Arc::clone(slots)));
    client_builder().build(connector)
}
