//! ZooKeeper's names: a contender's sequence number from its node's name, the holder among a lock's
//! children, and the watch's root above a mapping's lock nodes.

/// Digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// The watch's root for locks named from `prefix` (the text before the first placeholder) with
/// `slashes` slashes in all, and how many levels below it the lock nodes are.
pub(super) fn watch_root(prefix: &str, slashes: usize) -> (String, usize) {
    let root = match prefix.rfind('/') {
        Some(0) | None => "/",
        Some(last) => &prefix[..last],
    };
    let root_level = if root == "/" {
        0
    } else {
        root.matches('/').count()
    };
    (root.to_owned(), slashes.saturating_sub(root_level))
}

pub(super) fn child_path(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// A contender's sequence number: the digits ZooKeeper appended to a sequential node's name.
/// Other children (a lease node, a recipe's bookkeeping) are no contenders.
fn sequence_of(child: &str) -> Option<u64> {
    let digits = child.get(child.len().checked_sub(SEQUENCE_DIGITS)?..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The child holding the lock: the lowest sequence number.
pub(super) fn lowest_contender(children: &[String]) -> Option<(&str, u64)> {
    children
        .iter()
        .filter_map(|child| Some((child.as_str(), sequence_of(child)?)))
        .min_by_key(|(_, sequence)| *sequence)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recipe_names_its_contenders_with_a_sequence_number_at_the_end() {
        // The plain recipe, Curator's InterProcessMutex, kazoo's Lock.
        assert_eq!(sequence_of("lock-0000000007"), Some(7));
        assert_eq!(
            sequence_of("_c_4c3d6b0e-6a5f-4d0e-9a43-1f5b8f0a2c11-lock-0000000012"),
            Some(12)
        );
        assert_eq!(
            sequence_of("2f1c0bbd1d2e4f0c8a5c2f4d0c6e7b1a__lock__0000000003"),
            Some(3)
        );
        // No sequence: not a contender. A wrapped counter's sign is no digit.
        assert_eq!(sequence_of("leases"), None);
        assert_eq!(sequence_of("lock-000000007"), None);
        assert_eq!(sequence_of("lock--000000001"), None);
        assert_eq!(sequence_of("é-000000001"), None);
    }

    #[test]
    fn the_lowest_sequence_holds_whatever_the_names_before_it() {
        let children = [
            "_c_b-lock-0000000009".to_owned(),
            "leases".to_owned(),
            "_c_a-lock-0000000011".to_owned(),
            "_c_c-lock-0000000010".to_owned(),
        ];
        assert_eq!(
            lowest_contender(&children),
            Some(("_c_b-lock-0000000009", 9))
        );
        assert_eq!(lowest_contender(&["leases".to_owned()]), None);
        assert_eq!(lowest_contender(&[]), None);
    }

    #[test]
    fn the_watch_covers_the_deepest_node_above_every_lock() {
        // "/locks/invoice/{id}": 3 slashes, the prefix "/locks/invoice/".
        assert_eq!(
            watch_root("/locks/invoice/", 3),
            ("/locks/invoice".to_owned(), 1)
        );
        // "/locks/inv-{id}".
        assert_eq!(watch_root("/locks/inv-", 2), ("/locks".to_owned(), 1));
        // "/locks/{tenant}/invoice/{id}".
        assert_eq!(watch_root("/locks/", 4), ("/locks".to_owned(), 3));
        // "/{id}" and one fixed lock, "/locks/main".
        assert_eq!(watch_root("/", 1), ("/".to_owned(), 1));
        assert_eq!(watch_root("/locks/main", 2), ("/locks".to_owned(), 1));
        assert_eq!(child_path("/", "locks"), "/locks");
        assert_eq!(child_path("/locks", "7"), "/locks/7");
    }
}
