//! What the gateway knows of a lock service: each resource's current holder and the highest
//! token whose lease it saw end. Pure bookkeeping: the watch feeds it, requests read it.

use std::collections::HashMap;

/// A lock's holder as the watch last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub lock: String,
    pub token: u64,
}

/// What changed for one resource; each raises the resource's mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A lock was granted: `token` is the new holder's.
    Granted { resource: String, token: u64 },
    /// The holder's lease ended and no one holds the lock now.
    Ended { resource: String, token: u64 },
}

/// What the view says of one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The lock's current holder.
    Holder,
    /// A lease the view saw end (or a holder since superseded): `holder` is the current one.
    Ended { holder: Option<u64> },
    /// Neither: no holder is known, or the token is above the known holder's (the watch may lag).
    Unknown,
}

#[derive(Debug, Default)]
pub struct AuthorityView {
    holders: HashMap<String, Holder>,
    /// Per resource, the highest token whose lease ended while no one else held the lock, until
    /// the store's mark refuses it.
    ended: HashMap<String, u64>,
}

impl AuthorityView {
    /// Looks `token` up for `resource`.
    pub fn look(&self, resource: &str, token: u64) -> Seen {
        let holder = self.holders.get(resource).map(|h| h.token);
        match holder {
            Some(current) if current == token => return Seen::Holder,
            Some(current) if token < current => return Seen::Ended { holder },
            _ => {}
        }
        match self.ended.get(resource) {
            Some(&ended) if token <= ended => Seen::Ended { holder },
            _ => Seen::Unknown,
        }
    }

    pub fn holder(&self, resource: &str) -> Option<&Holder> {
        self.holders.get(resource)
    }

    /// Records `resource`'s holder now (`None`: the lock is free).
    pub fn set(&mut self, resource: &str, holder: Option<Holder>) -> Option<Change> {
        let before = self.holders.get(resource).map(|h| h.token);
        match holder {
            Some(holder) => {
                let token = holder.token;
                self.holders.insert(resource.to_owned(), holder);
                (before != Some(token)).then(|| Change::Granted {
                    resource: resource.to_owned(),
                    token,
                })
            }
            None => {
                let token = before?;
                self.holders.remove(resource);
                let ended = self.ended.entry(resource.to_owned()).or_insert(token);
                *ended = (*ended).max(token);
                Some(Change::Ended {
                    resource: resource.to_owned(),
                    token,
                })
            }
        }
    }

    /// Replaces every holder with `holders` (a fresh read of the lock service): resources that
    /// lost their holder count as ended, new or changed ones as granted.
    pub fn replace(&mut self, holders: HashMap<String, Holder>) -> Vec<Change> {
        let gone: Vec<String> = self
            .holders
            .keys()
            .filter(|resource| !holders.contains_key(*resource))
            .cloned()
            .collect();
        let mut changes: Vec<Change> = gone.iter().filter_map(|r| self.set(r, None)).collect();
        for (resource, holder) in holders {
            changes.extend(self.set(&resource, Some(holder)));
        }
        changes
    }

    /// The store's mark now refuses every token up to `token` of `resource`: nothing left to
    /// remember for it.
    pub fn fenced(&mut self, resource: &str, token: u64) {
        if self
            .ended
            .get(resource)
            .is_some_and(|&ended| ended <= token)
        {
            self.ended.remove(resource);
        }
    }

    pub fn holders(&self) -> usize {
        self.holders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(token: u64) -> Option<Holder> {
        Some(Holder {
            lock: "locks/a".to_owned(),
            token,
        })
    }

    #[test]
    fn a_grant_then_an_end_are_reported_and_seen() {
        let mut view = AuthorityView::default();
        assert_eq!(view.look("a", 10), Seen::Unknown);
        assert_eq!(
            view.set("a", holder(10)),
            Some(Change::Granted {
                resource: "a".to_owned(),
                token: 10
            })
        );
        assert_eq!(view.set("a", holder(10)), None, "no change, no report");
        assert_eq!(view.look("a", 10), Seen::Holder);
        assert_eq!(view.look("a", 9), Seen::Ended { holder: Some(10) });
        assert_eq!(view.look("a", 11), Seen::Unknown);
        assert_eq!(
            view.set("a", None),
            Some(Change::Ended {
                resource: "a".to_owned(),
                token: 10
            })
        );
        assert_eq!(view.look("a", 10), Seen::Ended { holder: None });
        assert_eq!(view.look("a", 11), Seen::Unknown);
        view.fenced("a", 10);
        assert_eq!(
            view.look("a", 10),
            Seen::Unknown,
            "the store refuses it now"
        );
    }

    #[test]
    fn a_resync_ends_what_vanished_and_grants_what_is_new() {
        let mut view = AuthorityView::default();
        view.set("a", holder(10));
        view.set("b", holder(11));
        let mut now = HashMap::new();
        now.insert("b".to_owned(), holder(12).expect("some"));
        now.insert("c".to_owned(), holder(13).expect("some"));
        let mut changes = view.replace(now);
        changes.sort_by_key(|c| match c {
            Change::Granted { token, .. } | Change::Ended { token, .. } => *token,
        });
        assert_eq!(
            changes,
            vec![
                Change::Ended {
                    resource: "a".to_owned(),
                    token: 10
                },
                Change::Granted {
                    resource: "b".to_owned(),
                    token: 12
                },
                Change::Granted {
                    resource: "c".to_owned(),
                    token: 13
                },
            ]
        );
        assert_eq!(view.holders(), 2);
    }
}
