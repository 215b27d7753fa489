//! The contenders for one lock, read from the lock node's children: each a
//! `<token>-<sequence>` node, put in line by their 32-bit sequence on a circle.

use crate::fence::Fence;
use crate::token::Token;

/// A contender node: its name under the lock node, its sequence and creation zxid.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) name: String,
    /// ZooKeeper's 32-bit counter (printed signed: past 2^31 it is negative), on a circle.
    pub(super) sequence: u32,
    pub(super) czxid: i64,
}

/// The contenders for one lock, lowest sequence first (`czxid` unknown: 0).
pub(super) struct Line(pub(super) Vec<Node>);

impl Line {
    /// The line of these children of a lock node. Children not made by this recipe (no
    /// `<token>-<sequence>` name) are not contenders.
    pub(super) fn of(children: Vec<String>) -> Self {
        let mut nodes: Vec<Node> = children
            .into_iter()
            .filter_map(|name| {
                let sequence = sequence_of(&name)? as u32;
                Some(Node {
                    name,
                    sequence,
                    czxid: 0,
                })
            })
            .collect();
        nodes.sort_by_key(|node| node.sequence);
        // The counter is 32 bits and wraps (it counts every create and delete of a child
        // while the lock node lives, and a busy lock node lives on: ZooKeeper deletes an
        // empty container only at its next check, a minute apart by default). The live
        // contenders always sit within a small arc of the circle, so the line starts after
        // the widest gap between two neighbours, the wrap included.
        if let (Some(first), Some(last)) = (nodes.first(), nodes.last()) {
            let around = first.sequence.wrapping_sub(last.sequence);
            let widest = nodes
                .windows(2)
                .enumerate()
                .map(|(i, pair)| (pair[1].sequence.wrapping_sub(pair[0].sequence), i + 1))
                .max_by_key(|&(gap, _)| gap);
            if let Some((gap, start)) = widest
                && gap > around
            {
                nodes.rotate_left(start);
            }
        }
        Line(nodes)
    }

    pub(super) fn head(&self) -> Option<&Node> {
        self.0.first()
    }

    /// Our nodes, earliest first (more than one only if a retried create made a second).
    pub(super) fn own<'a>(&'a self, token: &'a Token) -> impl Iterator<Item = &'a Node> + 'a {
        self.0.iter().filter(move |node| is_own(&node.name, token))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The sequence ZooKeeper appended to `<token>-`: ten digits, or a `-` and ten digits once
/// the counter has wrapped past 2^31 (`<token>--2147483648`).
fn sequence_of(name: &str) -> Option<i32> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (rest, number) = name.split_at(name.len() - digits);
    let number: i64 = number.parse().ok()?;
    let signed = match rest.strip_suffix("--") {
        Some(_token) => -number,
        None => rest.strip_suffix('-').map(|_token| number)?,
    };
    i32::try_from(signed).ok()
}

pub(super) fn is_own(name: &str, token: &Token) -> bool {
    name.strip_prefix(token.as_str())
        .is_some_and(|rest| rest.starts_with('-'))
}

pub(super) fn fence_of(czxid: i64) -> Fence {
    Fence::new(u64::try_from(czxid).expect("zxids are positive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_keeps_creation_order_when_the_counter_wraps_past_2_pow_32() {
        // 4294967294 and 4294967295 are printed -2 and -1; then the counter wraps to 0.
        let names = vec![
            "c-0000000001".to_owned(),
            "a--0000000002".to_owned(),
            "d-0000000003".to_owned(),
            "b--0000000001".to_owned(),
        ];

        let line = Line::of(names);

        let order: Vec<&str> = line.0.iter().map(|node| node.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "a--0000000002",
                "b--0000000001",
                "c-0000000001",
                "d-0000000003"
            ]
        );
    }

    #[test]
    fn the_line_keeps_creation_order_across_the_sequence_counters_wrap_past_2_pow_31() {
        let names = vec![
            "c--2147483648".to_owned(),
            "b-2147483647".to_owned(),
            "d--2147483647".to_owned(),
            "a-token-with-dashes-2147483646".to_owned(),
            "not-a-contender".to_owned(),
        ];

        let line = Line::of(names);

        let order: Vec<&str> = line.0.iter().map(|node| node.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "a-token-with-dashes-2147483646",
                "b-2147483647",
                "c--2147483648",
                "d--2147483647"
            ]
        );
    }
}
