//! What this build can run. The Cargo features (Cargo.toml) leave out stores, lock authorities,
//! the admin listener and span export; a configuration that names a part left out is refused
//! here, once, so that `check-config` refuses what `serve` could not start.

use super::{AuthorityKind, Config, StoreConfig};

/// A part of the configuration this build cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotBuilt {
    /// The route it is configured on, if any.
    pub route: Option<String>,
    /// The field that names it, e.g. `store.backend`.
    pub field: &'static str,
    pub message: String,
}

/// Why `what` cannot be used: the Cargo `feature` it needs was off when this build was made.
pub fn not_built_message(what: &str, feature: &str) -> String {
    format!(
        "this build of fencegate has no {what}: it was built without the Cargo feature `{feature}` (cargo build --features {feature})"
    )
}

/// The first part of `config` this build left out, if any.
pub fn check_built(config: &Config) -> Result<(), NotBuilt> {
    let refuse = |route: Option<&str>, field, what, feature| NotBuilt {
        route: route.map(str::to_owned),
        field,
        message: not_built_message(what, feature),
    };
    let store = match &config.store {
        StoreConfig::Embedded(_) => None,
        StoreConfig::Postgres(_) => {
            (!cfg!(feature = "postgres")).then_some(("PostgreSQL store", "postgres"))
        }
        StoreConfig::Redis(_) => (!cfg!(feature = "redis")).then_some(("Redis store", "redis")),
        StoreConfig::Etcd(_) => (!cfg!(feature = "etcd")).then_some(("etcd store", "etcd")),
    };
    if let Some((what, feature)) = store {
        return Err(refuse(None, "store.backend", what, feature));
    }
    if config.admin.is_some() && !cfg!(feature = "admin") {
        return Err(refuse(None, "admin", "admin listener", "admin"));
    }
    if config.telemetry.is_some() && !cfg!(feature = "otel") {
        return Err(refuse(None, "telemetry", "OTLP span export", "otel"));
    }
    for route in &config.routes {
        let Some(authority) = &route.fence.authority else {
            continue;
        };
        let missing =
            match authority.kind {
                AuthorityKind::Etcd => {
                    (!cfg!(feature = "etcd")).then_some(("etcd lock authority", "etcd"))
                }
                AuthorityKind::Postgres => (!cfg!(feature = "postgres"))
                    .then_some(("PostgreSQL lock authority", "postgres")),
                AuthorityKind::Zookeeper => (!cfg!(feature = "zookeeper"))
                    .then_some(("ZooKeeper lock authority", "zookeeper")),
            };
        if let Some((what, feature)) = missing {
            return Err(refuse(
                Some(&route.name),
                "fence.authority.kind",
                what,
                feature,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::parse_str;

    const SERVER: &str = "[server]\nlisten = \"127.0.0.1:0\"\n";

    /// Each part is accepted where it is built and refused, naming the field and the feature,
    /// where it is not. The default build runs the first half of each case; `.ci/run` runs these
    /// tests again in a build with `--no-default-features --features embed`, the second.
    #[test]
    fn a_part_left_out_of_the_build_is_refused_with_the_feature_that_brings_it() {
        let route = "[[routes]]\nname = \"jobs\"\npath = \"/jobs/{id}\"\nupstream = \"http://127.0.0.1:9\"\nresource_key = \"job:{id}\"\n";
        let cases = [
            (
                "[store]\nbackend = \"postgres\"\nurl = \"postgres://u@127.0.0.1/db\"\n".to_owned(),
                cfg!(feature = "postgres"),
                "store.backend",
                "postgres",
            ),
            (
                "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1/\"\n".to_owned(),
                cfg!(feature = "redis"),
                "store.backend",
                "redis",
            ),
            (
                "[store]\nbackend = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n".to_owned(),
                cfg!(feature = "etcd"),
                "store.backend",
                "etcd",
            ),
            (
                "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"0123456789abcdef0123\"\n".to_owned(),
                cfg!(feature = "admin"),
                "admin",
                "admin",
            ),
            (
                "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n".to_owned(),
                cfg!(feature = "otel"),
                "telemetry",
                "otel",
            ),
            (
                format!("{route}\n[routes.fence.authority]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\nlock_key = \"locks/{{id}}\"\n"),
                cfg!(feature = "etcd"),
                "fence.authority.kind",
                "etcd",
            ),
            (
                format!("{route}\n[routes.fence.authority]\nkind = \"postgres\"\nurl = \"postgres://u@127.0.0.1/db\"\nlock_key = \"locks/{{id}}\"\n"),
                cfg!(feature = "postgres"),
                "fence.authority.kind",
                "postgres",
            ),
            (
                format!("{route}\n[routes.fence.authority]\nkind = \"zookeeper\"\nhosts = \"127.0.0.1:2181\"\nlock_key = \"/locks/{{id}}\"\n"),
                cfg!(feature = "zookeeper"),
                "fence.authority.kind",
                "zookeeper",
            ),
        ];
        for (table, built, field, feature) in cases {
            let text = format!("{SERVER}{table}");
            let parsed = parse_str(&text, std::path::Path::new("t.toml"));
            if built {
                if let Err(error) = parsed {
                    panic!("{table}: refused in a build that has it: {error}");
                }
            } else {
                let error = parsed.expect_err(&table).to_string();
                assert!(
                    error.contains(field)
                        && error.contains(&format!("without the Cargo feature `{feature}`")),
                    "{table}: {error}"
                );
            }
        }
    }
}
