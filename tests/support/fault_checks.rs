//! The invariant checks of the fault matrix, over what clients saw and what the upstream recorded:
//! I1 (no stale forward), I2 (no mark lost), I5 (nothing forwarded without a verdict while the
//! store is out) and I7 (every client got an answer or a connection error). Each returns `Err`
//! describing the first violation.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::fault_upstream::{Arrival, OK_BODY};
use super::history::{check_history, ClientRecord, UpstreamRecord};
use super::outcome::Outcome;

/// Why a request was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A concurrent writer's, before, during or after the fault.
    Workload,
    /// Sent while the fault was in force, on a key of its own.
    Probe,
    /// Below a token the upstream already saw for its key, right after the fault was lifted.
    Zombie,
    /// A new generation after the run: the gateway must serve again.
    Fresh,
}

/// One client request and what came of it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub seq: u64,
    pub key: u64,
    pub token: u64,
    pub role: Role,
    pub sent: Instant,
    pub answered: Instant,
    pub outcome: Outcome,
}

/// The outcome's class for the allowed-outcome lists: a whole answer's status and problem type
/// (`200`, `503/store-unavailable`), `broken`, `no-answer` or `hung`.
pub fn class(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Answered(_) => outcome.label(),
        Outcome::BrokenBody { .. } => "broken".to_owned(),
        Outcome::NoAnswer(_) => "no-answer".to_owned(),
        Outcome::Hung => "hung".to_owned(),
    }
}

/// The key of a request to `/{route}/{key}`.
pub fn arrival_key(arrival: &Arrival) -> Result<u64, String> {
    arrival
        .target
        .rsplit('/')
        .next()
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| format!("upstream saw an unexpected target {}", arrival.target))
}

/// I1: per key, the tokens reaching the upstream never go down in arrival order (with
/// `ordering = "serialize"` a later arrival was forwarded after an earlier one was accepted), and
/// the team's history check holds for every whole 200 and every 409 — each 2xx forwarded exactly
/// once, each 409 never, with a current mark above its token.
pub fn check_no_stale_forward(sent: &[Sent], arrivals: &[Arrival]) -> Result<(), String> {
    let mut last: HashMap<u64, (u64, Option<u64>)> = HashMap::new();
    let mut ordered: Vec<&Arrival> = arrivals.iter().collect();
    ordered.sort_by_key(|a| a.arrived);
    for arrival in ordered {
        let key = arrival_key(arrival)?;
        let token = arrival.fence.ok_or(format!(
            "#{:?} reached the upstream without a token",
            arrival.seq
        ))?;
        if let Some((previous, seq)) = last.get(&key) {
            if token < *previous {
                return Err(format!(
                    "key {key}: token {token} (#{:?}) reached the upstream after token {previous} (#{seq:?})",
                    arrival.seq
                ));
            }
        }
        last.insert(key, (token, arrival.seq));
    }
    let decided: Vec<ClientRecord> = sent
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Answered(answer) if answer.status == 200 || answer.status == 409 => {
                Some(ClientRecord {
                    seq: s.seq,
                    key: s.key,
                    token: s.token,
                    sent: s.sent,
                    answered: s.answered,
                    status: answer.status,
                    current: answer.current,
                })
            }
            _ => None,
        })
        .collect();
    let seqs: HashSet<u64> = decided.iter().map(|c| c.seq).collect();
    let upstream: Vec<UpstreamRecord> = arrivals
        .iter()
        .filter_map(|a| {
            let seq = a.seq.filter(|seq| seqs.contains(seq))?;
            Some(UpstreamRecord {
                seq,
                key: arrival_key(a).ok()?,
                token: a.fence?,
            })
        })
        .collect();
    check_history(&decided, &upstream)
}

/// How often the upstream saw each request: every arrival belongs to a request a client sent;
/// refusals (409, 503) never arrive; whatever else (502, 504, broken, no answer) at most once.
pub fn check_forward_counts(sent: &[Sent], arrivals: &[Arrival]) -> Result<(), String> {
    let mut times: HashMap<u64, usize> = HashMap::new();
    let known: HashSet<u64> = sent.iter().map(|s| s.seq).collect();
    for arrival in arrivals {
        let seq = arrival
            .seq
            .ok_or(format!("{} arrived without x-seq", arrival.target))?;
        if !known.contains(&seq) {
            return Err(format!("upstream saw #{seq} which no client sent"));
        }
        *times.entry(seq).or_default() += 1;
    }
    for s in sent {
        let n = times.get(&s.seq).copied().unwrap_or(0);
        let allowed = match s.outcome.status() {
            Some(200) => 1..=1,
            Some(409 | 503) => 0..=0,
            _ => 0..=1,
        };
        if !allowed.contains(&n) {
            return Err(format!(
                "#{} ({:?}, key {}, token {}, {}) reached the upstream {n} times",
                s.seq,
                s.role,
                s.key,
                s.token,
                s.outcome.label()
            ));
        }
    }
    Ok(())
}

/// I2: each key's mark in the store (read after `arrivals` was taken) is at least every token
/// the upstream saw for it.
pub fn check_marks_cover(
    marks: &HashMap<u64, Option<u64>>,
    arrivals: &[Arrival],
) -> Result<(), String> {
    for (key, mark) in marks {
        let seen = arrivals
            .iter()
            .filter(|a| arrival_key(a).ok() == Some(*key))
            .filter_map(|a| a.fence)
            .max();
        if seen > *mark {
            return Err(format!(
                "key {key}: the store's mark is {mark:?}, the upstream saw token {seen:?}"
            ));
        }
    }
    Ok(())
}

/// No mark was invented: each key's mark is at most the largest token sent for it (with `sent`
/// taken after the marks were read).
pub fn check_marks_sent(marks: &HashMap<u64, Option<u64>>, sent: &[Sent]) -> Result<(), String> {
    for (key, mark) in marks {
        let largest_sent = sent.iter().filter(|s| s.key == *key).map(|s| s.token).max();
        if *mark > largest_sent {
            return Err(format!(
                "key {key}: the store's mark {mark:?} is above every token sent ({largest_sent:?})"
            ));
        }
    }
    Ok(())
}

/// I5: a request sent after the store went out of reach and answered before it came back got a
/// refusal (503, or 409 from the cached mark) and never reached the upstream.
pub fn check_fail_closed(
    sent: &[Sent],
    arrivals: &[Arrival],
    out: Instant,
    back: Instant,
) -> Result<usize, String> {
    let forwarded: HashSet<u64> = arrivals.iter().filter_map(|a| a.seq).collect();
    let mut inside = 0;
    for s in sent.iter().filter(|s| s.sent >= out && s.answered <= back) {
        inside += 1;
        if !matches!(s.outcome.status(), Some(409 | 503)) || forwarded.contains(&s.seq) {
            return Err(format!(
                "#{} ({:?}, key {}, token {}) was sent and answered while the store was out: {}, forwarded: {}",
                s.seq,
                s.role,
                s.key,
                s.token,
                s.outcome.label(),
                forwarded.contains(&s.seq)
            ));
        }
    }
    Ok(inside)
}

/// I7: nobody hung; every answer is one of `allowed` (classes as [`class`] names them); every
/// refusal is a problem document with a type; every 200 is the upstream's whole body.
pub fn check_answers(sent: &[Sent], allowed: &[&str]) -> Result<(), String> {
    for s in sent {
        let class = class(&s.outcome);
        if !allowed.contains(&class.as_str()) {
            return Err(format!(
                "#{} ({:?}, key {}, token {}): {} is not among {allowed:?} ({:?})",
                s.seq, s.role, s.key, s.token, class, s.outcome
            ));
        }
        if let Outcome::Answered(answer) = &s.outcome {
            let whole = if answer.status >= 400 {
                answer.content_type.as_deref() == Some("application/problem+json")
                    && answer.problem.is_some()
            } else {
                answer.body.as_ref() == OK_BODY
            };
            if !whole {
                return Err(format!(
                    "#{} ({:?}): {} without the expected body: {answer:?}",
                    s.seq, s.role, answer.status
                ));
            }
        }
    }
    Ok(())
}

/// How many requests had each outcome label, for the cell's summary line.
pub fn tally(sent: &[Sent]) -> Vec<(String, usize)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for s in sent {
        *counts.entry(s.outcome.label()).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    counts
}
