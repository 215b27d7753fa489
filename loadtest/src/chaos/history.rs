//! What the soak saw, as Jepsen keeps a history: every purchase and restock attempt with its
//! answer, and every fault, each with its times.
//!
//! Times are microseconds since the Unix epoch, read from the system clock: PostgreSQL runs
//! on the same machine and stamps commits with the same clock, so an answer's times and a
//! commit's can be compared (with the slack the checker allows).

use std::time::{SystemTime, UNIX_EPOCH};

use super::schedule::FaultKind;

/// Microseconds since the Unix epoch.
pub type Micros = i64;

/// The system clock now.
pub fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// What one request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP answer: its status, the `error` code of the body (empty for a 2xx or a body
    /// that could not be read), and the order id it named (a 201's order, or the buyer's
    /// order carried by `already_purchased`).
    Http {
        status: u16,
        code: String,
        order_id: Option<i64>,
    },
    /// No answer: the connection failed or the request timed out. Whether it took effect
    /// is unknown.
    Lost(String),
}

impl Answer {
    pub fn status(&self) -> Option<u16> {
        match self {
            Answer::Http { status, .. } => Some(*status),
            Answer::Lost(_) => None,
        }
    }

    pub fn code(&self) -> &str {
        match self {
            Answer::Http { code, .. } => code,
            Answer::Lost(_) => "",
        }
    }

    pub fn order_id(&self) -> Option<i64> {
        match self {
            Answer::Http { order_id, .. } => *order_id,
            Answer::Lost(_) => None,
        }
    }

    /// Whether the answer leaves the outcome open: no answer, a 503 `outcome_unknown`, or a
    /// 5xx that is not a 503 (a bug, which says nothing either). Every other 503 says that
    /// nothing was recorded.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Answer::Lost(_) => true,
            Answer::Http {
                status: 503, code, ..
            } => code == "outcome_unknown",
            Answer::Http { status, .. } => (500..600).contains(status),
        }
    }

    /// Whether the client is done with this request: a 2xx or a 4xx. A 5xx or a lost answer
    /// is tried again.
    pub fn is_final(&self) -> bool {
        matches!(self.status(), Some(200..=499))
    }

    /// `status code` (`201`, `409 sold_out`, `unknown`), for tables and messages.
    pub fn label(&self) -> String {
        match self {
            Answer::Http { status, code, .. } if code.is_empty() => status.to_string(),
            Answer::Http { status, code, .. } => format!("{status} {code}"),
            Answer::Lost(_) => "unknown (no answer)".to_owned(),
        }
    }
}

/// One purchase request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The buyer (each buyer of a soak has an id of their own).
    pub user: i64,
    /// Which instance it was sent to (its slot: a restarted instance keeps its number).
    pub instance: usize,
    pub sent_us: Micros,
    /// When the answer came, or when the request was given up.
    pub answered_us: Micros,
    pub answer: Answer,
}

impl Attempt {
    pub fn is_created(&self) -> bool {
        self.answer.status() == Some(201)
    }

    pub fn is_sold_out(&self) -> bool {
        self.answer.status() == Some(409) && self.answer.code() == "sold_out"
    }
}

/// One request of a restock (a restock is tried again, with the same `Idempotency-Key`,
/// until an answer says whether it was applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestockAttempt {
    pub instance: usize,
    pub sent_us: Micros,
    pub answered_us: Micros,
    pub answer: Answer,
}

/// One restock, with all its attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restock {
    /// Its `Idempotency-Key`.
    pub key: String,
    pub units: i64,
    pub attempts: Vec<RestockAttempt>,
}

impl Restock {
    /// When it was applied for sure: the first 2xx answer (its commit came before).
    pub fn applied_by(&self) -> Option<Micros> {
        self.attempts
            .iter()
            .find(|a| matches!(a.answer.status(), Some(200..=299)))
            .map(|a| a.answered_us)
    }

    /// Whether an answer said it was refused (a 4xx: nothing was written), and none said it
    /// was applied.
    pub fn refused(&self) -> bool {
        self.applied_by().is_none()
            && self
                .attempts
                .iter()
                .any(|a| matches!(a.answer.status(), Some(400..=499)))
    }

    /// Whether its outcome is known: applied, or refused.
    pub fn resolved(&self) -> bool {
        self.applied_by().is_some() || self.refused()
    }
}

/// One fault the nemesis injected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRecord {
    /// Its place in the schedule, from 1.
    pub index: usize,
    pub kind: FaultKind,
    /// The instance it was done to (the kinds done to one instance).
    pub instance: Option<usize>,
    /// What exactly was done (which instance, links, latency, how long).
    pub detail: String,
    pub injected_us: Micros,
    /// When it was healed (the instance ready again, the server accepting connections, the
    /// proxy passing traffic again).
    pub healed_us: Micros,
}
