//! The real gateway, in process, on a real socket, with its embedded store in a temporary
//! directory. Routes are given as TOML and go through the same loader as the binary's file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencegate::guard::CheckedStore;
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
    store: Arc<CheckedStore>,
    backend: Arc<dyn FenceStore>,
    intents: Option<Arc<dyn fencegate::store::IntentStore>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _temp: Option<tempfile::TempDir>,
}

/// How a test gateway is to start: its routes, and what differs from a fresh embedded store in a
/// temporary directory with no admin listener.
pub struct GatewayBuilder {
    routes_toml: String,
    dir: Option<PathBuf>,
    store: Option<Arc<dyn FenceStore>>,
    store_toml: Option<String>,
    admin_toml: Option<String>,
    server_options: String,
    /// Tables placed after `[server]`'s keys (`[server.tls]`, say).
    server_tables: String,
    /// Write the configuration to a file in the state directory, so reloads re-read it.
    config_file: bool,
}

impl GatewayBuilder {
    /// Tables below `[server]` (`[server.tls]`), placed after its keys.
    pub fn server_tables(mut self, tables: &str) -> GatewayBuilder {
        self.server_tables = tables.to_owned();
        self
    }

    /// The configuration goes to `<dir>/fencegate.toml`, which reloads re-read.
    pub fn config_file(mut self) -> GatewayBuilder {
        self.config_file = true;
        self
    }

    /// State (and the embedded store) in `dir`, kept across restarts, instead of a fresh one.
    pub fn in_dir(mut self, dir: &Path) -> GatewayBuilder {
        self.dir = Some(dir.to_owned());
        self
    }

    /// A store the test made (a failing or stalling one, say); the adoption check is skipped.
    pub fn store(mut self, store: Arc<dyn FenceStore>) -> GatewayBuilder {
        self.store = Some(store);
        self
    }

    /// This whole `[store]` table instead of the embedded store.
    pub fn store_toml(mut self, store_toml: &str) -> GatewayBuilder {
        self.store_toml = Some(store_toml.to_owned());
        self
    }

    /// An admin listener with bearer `token`.
    pub fn admin(self, token: &str) -> GatewayBuilder {
        let admin = format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n\n");
        self.admin_toml(&admin)
    }

    /// This `[admin]` table (which must listen on `127.0.0.1:0`).
    pub fn admin_toml(mut self, admin: &str) -> GatewayBuilder {
        self.admin_toml = Some(admin.to_owned());
        self
    }

    /// These TOML lines in the `[server]` table too.
    pub fn server_options(mut self, options: &str) -> GatewayBuilder {
        self.server_options = options.to_owned();
        self
    }

    pub async fn start(self) -> TestGateway {
        let temp = match &self.dir {
            Some(_) => None,
            None => Some(tempfile::tempdir().expect("temp dir")),
        };
        let dir = self
            .dir
            .clone()
            .or_else(|| temp.as_ref().map(|t| t.path().to_owned()))
            .expect("a directory");
        let store_toml = self.store_toml.unwrap_or_else(|| embedded_store(&dir));
        let mut text = config_text_with_store(&dir, "127.0.0.1:0", &store_toml, &self.routes_toml);
        if !self.server_options.is_empty() {
            text = with_server_options(&text, &self.server_options);
        }
        if !self.server_tables.is_empty() {
            text = text.replacen(
                &store_toml,
                &format!("{}\n{store_toml}", self.server_tables),
                1,
            );
        }
        if let Some(admin) = &self.admin_toml {
            text.push_str(admin);
        }
        let file = self.config_file.then(|| {
            let path = dir.join("fencegate.toml");
            std::fs::write(&path, &text).expect("write the configuration");
            path
        });
        let mut gateway = TestGateway::start_text(&dir, &text, self.store, file.as_deref()).await;
        gateway._temp = temp;
        gateway
    }
}

impl TestGateway {
    /// Starts a gateway with `routes_toml` (one or more `[[routes]]` tables) on a fresh store.
    pub async fn start(routes_toml: &str) -> TestGateway {
        TestGateway::builder(routes_toml).start().await
    }

    /// A gateway with `routes_toml`, to be set up further before it starts.
    pub fn builder(routes_toml: &str) -> GatewayBuilder {
        GatewayBuilder {
            routes_toml: routes_toml.to_owned(),
            dir: None,
            store: None,
            store_toml: None,
            admin_toml: None,
            server_options: String::new(),
            server_tables: String::new(),
            config_file: false,
        }
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
        TestGateway::start_text(dir, &text, None, None).await
    }

    async fn start_text(
        dir: &Path,
        text: &str,
        store: Option<Arc<dyn FenceStore>>,
        file: Option<&Path>,
    ) -> TestGateway {
        let config = fencegate::Compiled::parse(text, Path::new("test.toml"))
            .unwrap_or_else(|e| panic!("test config must load: {e}\n{text}"));
        let names: Vec<String> = config
            .config
            .routes
            .iter()
            .map(|r| r.name.clone())
            .collect();
        let mut app = match store {
            Some(store) => App::with_store(config, store).expect("gateway builds"),
            None => App::build(config).await.expect("gateway builds"),
        };
        if let Some(file) = file {
            let text = std::fs::read_to_string(file).expect("read the config file");
            app.set_config_source(file, &text);
        }
        let admin = app.bind_admin().await.expect("bind admin");
        let routes = names
            .into_iter()
            .map(|n| {
                let route = app.route(&n).expect("route exists");
                (n, route)
            })
            .collect();
        let store = app.store();
        let backend = app.backend();
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
            backend,
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

    pub fn store(&self) -> &CheckedStore {
        self.store.as_ref()
    }

    /// The backend without the gateway's cache and checks.
    pub fn backend(&self) -> &dyn FenceStore {
        self.backend.as_ref()
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

/// `text` (from [`config_text`]) with the TOML lines `options` at the top of `[server]`, in place
/// of the defaults `config_text` writes for the same keys (`drain_delay`, `shutdown_grace`, …).
pub fn with_server_options(text: &str, options: &str) -> String {
    let set: Vec<&str> = options
        .lines()
        .filter_map(|line| line.split_once('=').map(|(key, _)| key.trim()))
        .collect();
    let (server, rest) = text
        .split_once("\n\n")
        .expect("a [server] table, then the others");
    let kept: Vec<&str> = server
        .lines()
        .filter(|line| {
            line.split_once('=')
                .is_none_or(|(key, _)| !set.contains(&key.trim()))
        })
        .collect();
    let kept = kept.join("\n");
    let with = kept.replacen("[server]", &format!("[server]\n{}", options.trim_end()), 1);
    format!("{with}\n\n{rest}")
}

/// A whole configuration file with the given `[store]` table; the gateway's state goes to `dir`.
pub fn config_text_with_store(
    dir: &Path,
    listen: &str,
    store_toml: &str,
    routes_toml: &str,
) -> String {
    format!(
        "[server]\nlisten = \"{listen}\"\nshutdown_grace = \"5s\"\ndrain_delay = \"0s\"\nstate_dir = \"{dir}\"\nstore_check_interval = \"200ms\"\nintent_prune_interval = \"100ms\"\n\n{store_toml}\n{routes_toml}\n",
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
