//! What ZooKeeper accepts as a node name and as the root of the lock nodes.

/// Why `root` cannot be the parent of lock nodes, if it cannot.
pub(super) fn root_problem(root: &str) -> Option<&'static str> {
    let Some(path) = root.strip_prefix('/') else {
        return Some("it does not start with '/'");
    };
    if path.is_empty() {
        return Some("it is the root node itself");
    }
    if path.split('/').next() == Some("zookeeper") {
        return Some("/zookeeper is ZooKeeper's own");
    }
    path.split('/').find_map(|part| match part {
        "" => Some("it has an empty part ('//')"),
        part => node_name_problem(part),
    })
}

/// Why ZooKeeper would refuse `name` as a node name, if it would (its documented rules: no
/// `/`, not `.` or `..`, no NUL, no control character, nothing in U+E000..U+F8FF or
/// U+FFF0..U+FFFF).
pub(super) fn node_name_problem(name: &str) -> Option<&'static str> {
    let refused = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    if name.contains('/') {
        Some("it contains '/' (a ZooKeeper node name cannot)")
    } else if name == "." || name == ".." {
        Some("it is '.' or '..' (not a ZooKeeper node name)")
    } else if name.chars().any(refused) {
        Some(
            "it contains a character ZooKeeper refuses in a node name (a control character, U+E000..U+F8FF or U+FFF0..U+FFFF)",
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_roots_zookeeper_refuses_are_refused() {
        for name in [
            "a/b",
            ".",
            "..",
            "a\u{0}",
            "a\u{7f}",
            "a\u{e000}",
            "a\u{fff0}",
        ] {
            assert!(node_name_problem(name).is_some(), "{name:?} passed");
        }
        for name in ["lock_sale_1", "a.b", "…", "ключ"] {
            assert_eq!(node_name_problem(name), None, "{name:?} refused");
        }
        for root in [
            "distlock",
            "/",
            "/zookeeper",
            "/zookeeper/x",
            "/a//b",
            "/a/./b",
            "/a/\u{1}",
        ] {
            assert!(root_problem(root).is_some(), "{root:?} passed");
        }
        for root in ["/distlock", "/locks/sale", "/zookeeperish"] {
            assert_eq!(root_problem(root), None, "{root:?} refused");
        }
    }
}
