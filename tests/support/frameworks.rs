//! Real, unmodified upstream frameworks for the differential tests (`tests/upstreams/`): Flask,
//! Django, Express, Go's net/http, Rails and Spring MVC, each recording which resource it applied
//! a write to, and nginx's WebDAV module, whose files are the record. `scripts/test.sh` installs
//! them; a missing one fails the test that needs it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client::try_send;
use super::process::free_port;
use super::send;

/// Ports tried before a framework's start counts as failed.
const START_ATTEMPTS: usize = 3;
/// How long a framework may take to accept connections (Go and Spring compile first).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    Flask,
    Django,
    Express,
    GoNetHttp,
    Rails,
    SpringMvc,
    NginxDav,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Framework::Flask => "flask",
            Framework::Django => "django",
            Framework::Express => "express",
            Framework::GoNetHttp => "go-net-http",
            Framework::Rails => "rails",
            Framework::SpringMvc => "spring-mvc",
            Framework::NginxDav => "nginx-dav",
        }
    }
}

/// One write a framework applied: the resource it names it by (`invoice:1`, `file:acct1`,
/// `other:/x`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub resource: String,
    pub method: String,
}

/// A running framework upstream.
pub struct FrameworkUpstream {
    pub framework: Framework,
    pub addr: SocketAddr,
    child: Child,
    /// nginx: where its files live; the others: scratch space (the Go binary).
    dir: tempfile::TempDir,
    /// Flask/Express/Go: how many records were already returned.
    seen: usize,
    /// nginx: the files as last seen.
    files: BTreeMap<PathBuf, Vec<u8>>,
}

fn upstreams_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams")
}

fn spawn(command: &mut Command, what: &str) -> Child {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{what} could not be started ({e}); run tests/upstreams/install.sh (scripts/test.sh does)")
        })
}

impl FrameworkUpstream {
    /// Starts `framework` on a free port. The port is free when it is picked but is given to the
    /// framework only when it binds it, so another socket can take it in between: then the
    /// framework exits at start, or an impostor answers on its port. Either way a new port is
    /// tried (at most [`START_ATTEMPTS`] in all).
    pub async fn start(framework: Framework) -> FrameworkUpstream {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::tempdir().expect("temp dir");
            let addr = free_port();
            let child = FrameworkUpstream::spawn_on(framework, &dir, addr);
            let mut upstream = FrameworkUpstream {
                framework,
                addr,
                child,
                dir,
                seen: 0,
                files: BTreeMap::new(),
            };
            match upstream.wait_ready().await {
                Ok(()) => {
                    upstream.files = upstream.snapshot();
                    return upstream;
                }
                Err(why) => last = why,
            }
        }
        panic!(
            "{} did not start in {START_ATTEMPTS} attempts: {last}; run tests/upstreams/install.sh",
            framework.name()
        );
    }

    fn spawn_on(framework: Framework, dir: &tempfile::TempDir, addr: SocketAddr) -> Child {
        let port = addr.port().to_string();
        let here = upstreams_dir();
        match framework {
            Framework::Flask => spawn(
                Command::new("python3")
                    .arg(here.join("flask_app.py"))
                    .arg(&port),
                "python3 with Flask",
            ),
            Framework::Django => spawn(
                Command::new("python3")
                    .arg(here.join("django_app.py"))
                    .arg(&port),
                "python3 with Django",
            ),
            Framework::Rails => spawn(
                Command::new("ruby")
                    .arg(here.join("rails_app/server.rb"))
                    .arg(&port),
                "ruby with Rails",
            ),
            Framework::SpringMvc => spawn(
                Command::new("bash")
                    .arg(here.join("spring_app/run.sh"))
                    .arg(&port)
                    .arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("spring-app")),
                "the Spring MVC upstream",
            ),
            Framework::Express => spawn(
                Command::new("node")
                    .arg(here.join("express_app.js"))
                    .arg(&port),
                "node with Express",
            ),
            Framework::GoNetHttp => {
                let binary = dir.path().join("go_app");
                let built = Command::new("go")
                    .arg("build")
                    .arg("-o")
                    .arg(&binary)
                    .arg(here.join("go_app.go"))
                    .env(
                        "GOCACHE",
                        Path::new(env!("CARGO_TARGET_TMPDIR")).join("gocache"),
                    )
                    // GOPATH mode, on Debian's source of github.com/google/uuid.
                    .env("GO111MODULE", "off")
                    .env("GOPATH", "/usr/share/gocode")
                    .status()
                    .unwrap_or_else(|e| {
                        panic!("go could not be run ({e}); run tests/upstreams/install.sh")
                    });
                assert!(
                    built.success(),
                    "go build of tests/upstreams/go_app.go failed"
                );
                spawn(Command::new(&binary).arg(&port), "the Go upstream")
            }
            Framework::NginxDav => {
                let prefix = dir.path().join("nginx");
                let root = dir.path().join("root");
                std::fs::create_dir_all(root.join("files/ledger")).expect("nginx root");
                std::fs::create_dir_all(root.join("files/public")).expect("nginx root");
                std::fs::create_dir_all(&prefix).expect("nginx prefix");
                let template =
                    std::fs::read_to_string(here.join("nginx_dav.conf")).expect("nginx template");
                let conf = template
                    .replace("@PORT@", &port)
                    .replace("@ROOT@", &root.to_string_lossy())
                    .replace("@PREFIX@", &prefix.to_string_lossy());
                let conf_path = prefix.join("nginx.conf");
                std::fs::write(&conf_path, conf).expect("nginx conf");
                spawn(
                    Command::new("nginx")
                        .arg("-p")
                        .arg(&prefix)
                        .arg("-e")
                        .arg(prefix.join("error.log"))
                        .arg("-c")
                        .arg(&conf_path)
                        .arg("-g")
                        .arg("daemon off;"),
                    "nginx",
                )
            }
        }
    }

    /// Waits until the framework itself answers on its port; `Err` if it exited first.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("it exited at start ({status}) on {}", self.addr));
            }
            if self.answers_as_itself().await {
                return Ok(());
            }
            assert!(
                started.elapsed() < STARTUP_TIMEOUT,
                "{} did not answer within {STARTUP_TIMEOUT:?}",
                self.framework.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether what answers on the port is this framework: its record endpoint, or nginx's name.
    async fn answers_as_itself(&self) -> bool {
        let probe = match self.framework {
            Framework::NginxDav => "/",
            _ => "/_record",
        };
        let Ok(reply) = try_send("GET", &self.url(probe), &[], "").await else {
            return false;
        };
        match self.framework {
            Framework::NginxDav => reply
                .header("server")
                .is_some_and(|server| server.starts_with("nginx")),
            _ => reply.status == 200 && reply.json().is_array(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// nginx: writes `content` to a file under its root directly (not through the gateway).
    pub fn seed_file(&mut self, relative: &str, content: &str) {
        let path = self.root().join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("seed dir");
        }
        std::fs::write(&path, content).expect("seed file");
        self.files = self.snapshot();
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The writes applied since the last call.
    pub async fn applied_since(&mut self) -> Vec<Applied> {
        if self.framework == Framework::NginxDav {
            let now = self.snapshot();
            let mut changed = Vec::new();
            for (path, content) in &now {
                if self.files.get(path) != Some(content) {
                    changed.push(file_resource(path, "changed"));
                }
            }
            for path in self.files.keys() {
                if !now.contains_key(path) {
                    changed.push(file_resource(path, "removed"));
                }
            }
            self.files = now;
            return changed;
        }
        let reply = send("GET", &self.url("/_record"), &[], "").await;
        assert_eq!(reply.status, 200, "{} /_record", self.framework.name());
        let records = reply.json();
        let records = records.as_array().expect("records are an array");
        let fresh = records[self.seen..]
            .iter()
            .map(|r| Applied {
                resource: r["resource"].as_str().unwrap_or_default().to_owned(),
                method: r["method"].as_str().unwrap_or_default().to_owned(),
            })
            .collect();
        self.seen = records.len();
        fresh
    }

    /// Every file under nginx's root, by path relative to it, with its content.
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        if self.framework != Framework::NginxDav {
            return files;
        }
        let root = self.root();
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    // An empty directory (MKCOL) is a resource too.
                    files.insert(
                        path.strip_prefix(&root).expect("under root").to_owned(),
                        b"<dir>".to_vec(),
                    );
                    pending.push(path);
                } else if let Ok(content) = std::fs::read(&path) {
                    files.insert(
                        path.strip_prefix(&root).expect("under root").to_owned(),
                        content,
                    );
                }
            }
        }
        files
    }
}

/// nginx's resource for a file: `file:NAME` for `files/ledger/NAME`, else `other:/PATH`.
fn file_resource(relative: &Path, how: &str) -> Applied {
    let text = relative.to_string_lossy();
    let resource = match text.strip_prefix("files/ledger/") {
        Some(name) if !name.contains('/') => format!("file:{name}"),
        _ => format!("other:/{text}"),
    };
    Applied {
        resource,
        method: how.to_owned(),
    }
}

impl Drop for FrameworkUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
