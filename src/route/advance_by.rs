//! Which layer makes a route's compare-and-advance: decided once per route when its table is
//! installed in a gateway (at start and on every reload; `CompiledRoute::owner` decides), and
//! read by each layer as "am I the owner?".

use std::sync::OnceLock;

/// Which layer makes a fenced write's compare-and-advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdvanceBy {
    /// The fence, before anything else sees the request.
    #[default]
    Fence,
    /// The idempotency layer, together with beginning the write's intent (one store round
    /// where the backend has one).
    Intent,
    /// The ordering gate, in the store step that takes the key's cross-replica turn.
    Turn,
}

/// A route's owner once installed; a route outside a gateway (`check-config`, unit tests) has
/// the fence make its advance.
#[derive(Debug, Clone, Default)]
pub struct InstalledOwner(OnceLock<AdvanceBy>);

impl InstalledOwner {
    /// Sets the owner; a second install of the same table keeps the first.
    pub fn set(&self, by: AdvanceBy) {
        let _ = self.0.set(by);
    }

    pub fn get(&self) -> AdvanceBy {
        self.0.get().copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::AdvanceBy;
    use crate::config::parse_str;
    use crate::route::RouteTable;

    /// One route per line of the decision, named by what it should get.
    const ROUTES: &str = r#"
[server]
listen = "127.0.0.1:0"

[[routes]]
name = "plain"
path = "/plain/{id}"
upstream = "http://127.0.0.1:9"
resource_key = "p:{id}"
[routes.fence]
ordering = "none"

[[routes]]
name = "serialized"
path = "/serialized/{id}"
upstream = "http://127.0.0.1:9"
resource_key = "s:{id}"

[[routes]]
name = "idempotent"
path = "/idempotent/{id}"
upstream = "http://127.0.0.1:9"
resource_key = "i:{id}"
[routes.fence]
ordering = "serialize"
[routes.idempotency]
key = "pay:{id}"

[[routes]]
name = "observed"
path = "/observed/{id}"
upstream = "http://127.0.0.1:9"
resource_key = "o:{id}"
[routes.fence]
mode = "observe"
ordering = "serialize"
[routes.idempotency]
key = "pay:{id}"

[[routes]]
name = "open"
path = "/open/{id}"
upstream = "http://127.0.0.1:9"
resource_key = "f:{id}"
[routes.fence]
on_store_error = "fail_open"
ordering = "serialize"
"#;

    #[test]
    fn routing_gives_the_advance_to_one_layer() {
        let config = parse_str(ROUTES, std::path::Path::new("t.toml")).unwrap();
        let table = RouteTable::compile(&config.routes).unwrap();
        let by = |name: &str, turns_advance: bool| table.get(name).unwrap().owner(turns_advance);
        for turns_advance in [false, true] {
            assert_eq!(by("plain", turns_advance), AdvanceBy::Fence);
            // The intent's begin goes with the advance, even where the gate could make it.
            assert_eq!(by("idempotent", turns_advance), AdvanceBy::Intent);
            // A route that forwards past a refusal has its advance made before anything else.
            assert_eq!(by("observed", turns_advance), AdvanceBy::Fence);
            assert_eq!(by("open", turns_advance), AdvanceBy::Fence);
        }
        assert_eq!(by("serialized", false), AdvanceBy::Fence);
        assert_eq!(by("serialized", true), AdvanceBy::Turn);
    }

    #[test]
    fn an_installed_table_keeps_each_routes_owner_and_a_fresh_one_has_the_fence() {
        let config = parse_str(ROUTES, std::path::Path::new("t.toml")).unwrap();
        let table = RouteTable::compile(&config.routes).unwrap();
        let serialized = table.get("serialized").unwrap();
        assert_eq!(serialized.advance_by(), AdvanceBy::Fence);
        table.install_owners(true);
        assert_eq!(serialized.advance_by(), AdvanceBy::Turn);
        // A second install of the same table (a reload that failed half way) keeps the first.
        table.install_owners(false);
        assert_eq!(serialized.advance_by(), AdvanceBy::Turn);
    }
}
