//! The real gateway, in process, on a real socket, with its embedded store in a temporary
//! directory. Routes are given as TOML and go through the same loader as the binary's file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencegate::route::CompiledRoute;
use fencegate::store::FenceStore;
use fencegate::App;
use tokio::sync::oneshot;

pub struct TestGateway {
    pub addr: SocketAddr,
    /// The admin listener, when the configuration has `[admin]`.
    pub admin: Option<SocketAddr>,
    pub dir: PathBuf,
    routes: Vec<(String, Arc<CompiledRoute>)>,
    store: Arc<dyn FenceStore>,
    intents: Option<Arc<dyn fencegate::store::IntentStore>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _temp: Option<tempfile::TempDir>,
}

impl TestGateway {
    /// Starts a gateway with `routes_toml` (one or more `[[routes]]` tables) on a fresh store.
    pub async fn start(routes_toml: &str) -> TestGateway {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = temp.path().to_owned();
        let mut gateway = TestGateway::start_in(&dir, routes_toml).await;
        gateway._temp = Some(temp);
        gateway
    }

    /// Starts a gateway whose store lives in `dir` (reused across restarts).
    pub async fn start_in(dir: &Path, routes_toml: &str) -> TestGateway {
        TestGateway::start_on(dir, routes_toml, None).await
    }

    /// Starts a gateway on a store the test made (a failing or stalling one, say).
    pub async fn start_with_store(routes_toml: &str, store: Arc<dyn FenceStore>) -> TestGateway {
        let temp = tempfile::tempdir().expect("temp dir");
        let mut gateway = TestGateway::start_on(temp.path(), routes_toml, Some(store)).await;
        gateway._temp = Some(temp);
        gateway
    }

    /// Starts a gateway with an admin listener (bearer `token`) on a fresh embedded store.
    pub async fn start_with_admin(routes_toml: &str, token: &str) -> TestGateway {
        let admin = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n\n");
        TestGateway::start_with_admin_toml(routes_toml, &admin).await
    }

    /// Starts a gateway with the given `[admin]` table (which must listen on `127.0.0.1:0`).
    pub async fn start_with_admin_toml(routes_toml: &str, admin: &str) -> TestGateway {
        let temp = tempfile::tempdir().expect("temp dir");
        let text = format!(
            "{}{admin}",
            config_text(temp.path(), "127.0.0.1:0", routes_toml)
        );
        let mut gateway = TestGateway::start_text(temp.path(), &text, None).await;
        gateway._temp = Some(temp);
        gateway
    }

    /// Starts a gateway whose `[server]` table also has `server_options` (TOML lines).
    pub async fn start_with_server_options(server_options: &str, routes_toml: &str) -> TestGateway {
        let temp = tempfile::tempdir().expect("temp dir");
        let text = config_text(temp.path(), "127.0.0.1:0", routes_toml).replacen(
            "[server]\n",
            &format!("[server]\n{server_options}\n"),
            1,
        );
        let mut gateway = TestGateway::start_text(temp.path(), &text, None).await;
        gateway._temp = Some(temp);
        gateway
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin.expect("admin listener"), path)
    }

    /// Starts a gateway with state in `dir` and the store `store_toml` (a whole `[store]` table).
    pub async fn start_with_store_config(
        dir: &Path,
        store_toml: &str,
        routes_toml: &str,
    ) -> TestGateway {
        let text = config_text_with_store(dir, "127.0.0.1:0", store_toml, routes_toml);
        TestGateway::start_text(dir, &text, None).await
    }

    async fn start_on(
        dir: &Path,
        routes_toml: &str,
        store: Option<Arc<dyn FenceStore>>,
    ) -> TestGateway {
        let text = config_text(dir, "127.0.0.1:0", routes_toml);
        TestGateway::start_text(dir, &text, store).await
    }

    async fn start_text(dir: &Path, text: &str, store: Option<Arc<dyn FenceStore>>) -> TestGateway {
        let config = fencegate::config::parse_str(text, Path::new("test.toml"))
            .unwrap_or_else(|e| panic!("test config must load: {e}\n{text}"));
        let names: Vec<String> = config.routes.iter().map(|r| r.name.clone()).collect();
        let mut app = match store {
            Some(store) => App::with_store(config, store).expect("gateway builds"),
            None => App::build(config).await.expect("gateway builds"),
        };
        let admin = app.bind_admin().await.expect("bind admin");
        let routes = names
            .into_iter()
            .map(|n| {
                let route = app.route(&n).expect("route exists");
                (n, route)
            })
            .collect();
        let store = app.store();
        let intents = app.intents();
        let listener = app.bind().await.expect("bind gateway");
        let addr = listener.local_addr().expect("gateway address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.serve(listener, async {
            let _ = stopped.await;
        }));
        TestGateway {
            addr,
            admin,
            dir: dir.to_owned(),
            routes,
            store,
            intents,
            stop: Some(stop),
            task,
            _temp: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn route(&self, name: &str) -> &CompiledRoute {
        &self
            .routes
            .iter()
            .find(|(n, _)| n == name)
            .expect("route")
            .1
    }

    pub fn store(&self) -> &dyn FenceStore {
        self.store.as_ref()
    }

    pub fn intents(&self) -> &dyn fencegate::store::IntentStore {
        self.intents
            .as_deref()
            .expect("this gateway has an intent store")
    }

    /// Stops serving, drains, and closes the store.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.expect("gateway task");
    }
}

/// The `[store]` table of an embedded store under `dir`.
pub fn embedded_store(dir: &Path) -> String {
    format!(
        "[store]\nbackend = \"embedded\"\npath = \"{}\"\n",
        dir.join("fencegate.db").display()
    )
}

/// A whole configuration file around `routes_toml`, storing marks under `dir`.
pub fn config_text(dir: &Path, listen: &str, routes_toml: &str) -> String {
    config_text_with_store(dir, listen, &embedded_store(dir), routes_toml)
}

/// A whole configuration file with the given `[store]` table; the gateway's state goes to `dir`.
pub fn config_text_with_store(
    dir: &Path,
    listen: &str,
    store_toml: &str,
    routes_toml: &str,
) -> String {
    format!(
        "[server]\nlisten = \"{listen}\"\nshutdown_grace = \"5s\"\nstate_dir = \"{dir}\"\nstore_check_interval = \"200ms\"\nintent_prune_interval = \"100ms\"\n\n{store_toml}\n{routes_toml}\n",
        dir = dir.display(),
    )
}

/// A fenced route named `name` at `/{name}/{{id}}` with key `{name}:{{id}}`.
/// An enforcing, monotonic, serialized route (`name:{id}` keys) with a 5 s upstream timeout and a
/// 15 s gate timeout.
pub fn serialized_route(name: &str, upstream: &str) -> String {
    let route = fenced_route(name, upstream, "enforce", "monotonic")
        .replace("timeout = \"2s\"", "timeout = \"5s\"")
        .replace(
            "compare = \"monotonic\"",
            "compare = \"monotonic\"\nordering = \"serialize\"\ngate_timeout = \"15s\"",
        );
    assert!(
        route.contains("timeout = \"5s\"") && route.contains("ordering = \"serialize\""),
        "the route template changed: {route}"
    );
    route
}

pub fn fenced_route(name: &str, upstream: &str, mode: &str, compare: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\npath = \"/{name}/{{id}}\"\nupstream = \"{upstream}\"\nresource_key = \"{name}:{{id}}\"\ntimeout = \"2s\"\n\n[routes.fence]\nmode = \"{mode}\"\ncompare = \"{compare}\"\n\n"
    )
}
