//! The I1 history check shared by the concurrency tests: from what clients saw and what the
//! upstream recorded, no request was forwarded with a token below a token whose 2xx had already
//! been returned for its key when the request was sent; every 2xx was forwarded exactly once and
//! every refusal never.

use std::collections::HashMap;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct ClientRecord {
    pub seq: u64,
    pub key: u64,
    pub token: u64,
    pub sent: Instant,
    pub answered: Instant,
    pub status: u16,
    pub current: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct UpstreamRecord {
    pub seq: u64,
    pub key: u64,
    pub token: u64,
}

/// Checks the history; `Err` describes the first violation.
pub fn check_history(clients: &[ClientRecord], upstream: &[UpstreamRecord]) -> Result<(), String> {
    let by_seq: HashMap<u64, &ClientRecord> = clients.iter().map(|c| (c.seq, c)).collect();
    let mut forwarded: HashMap<u64, usize> = HashMap::new();
    for record in upstream {
        *forwarded.entry(record.seq).or_default() += 1;
        let client = by_seq
            .get(&record.seq)
            .ok_or(format!("upstream saw #{} which no client sent", record.seq))?;
        // I1: nothing below a token whose 2xx had already been returned when this one was sent.
        if let Some(newer) = clients.iter().find(|c| {
            c.key == record.key
                && c.status == 200
                && c.token > record.token
                && c.answered < client.sent
        }) {
            return Err(format!(
                "key {}: token {} (#{}) was forwarded after token {} (#{}) had been acknowledged",
                record.key, record.token, record.seq, newer.token, newer.seq
            ));
        }
    }
    for client in clients {
        let times = forwarded.get(&client.seq).copied().unwrap_or(0);
        match client.status {
            200 if times != 1 => {
                return Err(format!("#{}: 2xx but forwarded {times} times", client.seq))
            }
            409 if times != 0 => return Err(format!("#{}: refused but forwarded", client.seq)),
            409 => match client.current {
                Some(current) if current > client.token => {}
                other => {
                    return Err(format!(
                        "#{}: 409 with current {other:?} for token {}",
                        client.seq, client.token
                    ))
                }
            },
            200 => {}
            other => return Err(format!("#{}: unexpected status {other}", client.seq)),
        }
    }
    Ok(())
}

/// One request as the upstream handled it, for the ordering checks.
#[derive(Debug, Clone)]
pub struct UpstreamSpan {
    pub seq: u64,
    pub key: u64,
    pub token: u64,
    pub arrived: Instant,
    pub finished: Instant,
}

/// I4 from the upstream's record: per key, the tokens in arrival order never decrease, and no
/// two requests of one key were handled at overlapping times.
pub fn check_serialized(spans: &[UpstreamSpan]) -> Result<(), String> {
    let mut by_key: HashMap<u64, Vec<&UpstreamSpan>> = HashMap::new();
    for span in spans {
        by_key.entry(span.key).or_default().push(span);
    }
    for (key, mut spans) in by_key {
        spans.sort_by_key(|s| s.arrived);
        for pair in spans.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            if later.token < earlier.token {
                return Err(format!(
                    "key {key}: token {} (#{}) reached the upstream after token {} (#{})",
                    later.token, later.seq, earlier.token, earlier.seq
                ));
            }
            if later.arrived < earlier.finished {
                return Err(format!(
                    "key {key}: #{} (token {}) overlapped #{} (token {}) at the upstream",
                    later.seq, later.token, earlier.seq, earlier.token
                ));
            }
        }
    }
    Ok(())
}
