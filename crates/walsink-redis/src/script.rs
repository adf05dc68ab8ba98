//! The commit marker's layout and encoding, and the small script that moves it at the end of
//! each transaction.
//!
//! The marker of a data key `KEY`, sink id and subtask is the hash
//! `walsink:{TAG}:committed:LEN:KEY:SINK/SUBTASK` ([`Config::marker_key`](crate::Config::marker_key)),
//! in the data key's hash slot (`LEN` is `KEY`'s length, so two keys never share one). Its field
//! `marker` holds `CHECKPOINT:NEXT:DONE`: the epoch being applied (its id padded to 20
//! digits), the index of its first record not applied yet, and `1` once the whole epoch is
//! applied. Its field `meta` holds `CHECKPOINT\nMETADATA` of the newest complete epoch. Only
//! that (sink id, subtask) writes the key, so it can be `WATCH`ed without parallel subtasks
//! aborting each other's transactions.
//!
//! Earlier versions kept both in one hash per hash tag, `walsink:{TAG}:committed`
//! ([`Config::old_marker_key`](crate::Config::old_marker_key)), as the fields `SINK/SUBTASK`
//! and `SINK/SUBTASK:meta`. They are read when the per-sink key does not exist, and the first
//! marker move moves them to it (in the same atomic step), so a deployment keeps its progress.
//!
//! Each transaction (see [`RedisSink`](crate::RedisSink)) is `WATCH` on the marker key, a read
//! of the marker and of the data key's type, then `MULTI`, the records as native `RPUSH`,
//! `XADD` or `HSET` commands, `EVAL` of [`MOVE`], `EXEC`. [`MOVE`] runs after the writes inside
//! the same `EXEC`, so nothing runs between them; it moves the marker only if the writes
//! landed (the key holds the mode's type and its last element is the transaction's last
//! record).

/// The Lua source of the marker move, sent whole with `EVAL` inside each `MULTI` (never
/// `EVALSHA`: a `NOSCRIPT` there would not stop the writes queued before it).
///
/// `KEYS[1]` data key, `KEYS[2]` marker key, `KEYS[3]` the old marker hash; `ARGV[1]` the
/// old marker field (`SINK/SUBTASK`), `ARGV[2]` the new marker, `ARGV[3]` the metadata entry
/// (`CHECKPOINT\nMETADATA`, on the epoch's last transaction) or empty, `ARGV[4]` mode,
/// `ARGV[5]` how many records the transaction wrote, `ARGV[6]` its last record (hash mode: its
/// field), `ARGV[7]` hash mode: its value. Returns 1, or an error (`WRONGTYPE`,
/// `WALSINK_NOT_WRITTEN`) without moving the marker.
pub const MOVE: &str = r#"
local mode = ARGV[4]
if tonumber(ARGV[5]) > 0 then
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t ~= mode then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' holds a ' .. t .. ', the sink writes a ' .. mode .. '; nothing written, the marker did not move')
  end
  local landed
  if mode == 'list' then
    landed = redis.call('LINDEX', KEYS[1], -1) == ARGV[6]
  elseif mode == 'hash' then
    landed = redis.call('HGET', KEYS[1], ARGV[6]) == ARGV[7]
  else
    local e = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
    landed = e ~= nil and e[2][1] == 'record' and e[2][2] == ARGV[6]
  end
  if not landed then
    return redis.error_reply('WALSINK_NOT_WRITTEN the last record of the transaction is not at the end of ' .. KEYS[1] .. '; the marker did not move')
  end
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local old = redis.call('HGET', KEYS[3], ARGV[1] .. ':meta')
  if old and ARGV[3] == '' then
    redis.call('HSET', KEYS[2], 'meta', old)
  end
  redis.call('HDEL', KEYS[3], ARGV[1], ARGV[1] .. ':meta')
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], 'marker', ARGV[2], 'meta', ARGV[3])
else
  redis.call('HSET', KEYS[2], 'marker', ARGV[2])
end
return 1
"#;

/// The marker's field in the old shared hash ([`Config::old_marker_key`](crate::Config::old_marker_key)),
/// `SINK/SUBTASK`; the metadata was in `SINK/SUBTASK:meta`.
pub fn field(sink_id: &str, subtask: u32) -> String {
    format!("{sink_id}/{subtask}")
}

/// A checkpoint id as the marker stores it (20 digits, so markers sort as strings).
pub fn padded(checkpoint: u64) -> String {
    format!("{checkpoint:020}")
}

/// A decoded marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// The epoch the marker is at.
    pub checkpoint: u64,
    /// Index of its first record not applied yet.
    pub next: u64,
    /// Whether the whole epoch is applied.
    pub done: bool,
}

impl Marker {
    /// Decodes `CHECKPOINT:NEXT:DONE`.
    pub fn decode(s: &str) -> Option<Marker> {
        let mut it = s.split(':');
        let checkpoint = it.next()?.parse().ok()?;
        let next = it.next()?.parse().ok()?;
        let done = match it.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        it.next().is_none().then_some(Marker {
            checkpoint,
            next,
            done,
        })
    }

    /// Encodes it as `CHECKPOINT:NEXT:DONE`, the checkpoint padded to 20 digits.
    pub fn encode(&self) -> String {
        format!(
            "{}:{}:{}",
            padded(self.checkpoint),
            self.next,
            if self.done { 1 } else { 0 }
        )
    }

    /// Whether the target holds the whole of epoch `checkpoint`.
    pub fn covers(&self, checkpoint: u64) -> bool {
        self.checkpoint > checkpoint || (self.checkpoint == checkpoint && self.done)
    }

    /// Where epoch `checkpoint` resumes: the index of its first record not applied.
    pub fn resume_at(&self, checkpoint: u64) -> u64 {
        if self.checkpoint == checkpoint {
            self.next
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip() {
        let m = Marker::decode(&format!("{}:17:0", padded(42))).unwrap();
        assert_eq!(
            m,
            Marker {
                checkpoint: 42,
                next: 17,
                done: false
            }
        );
        assert_eq!(Marker::decode(&m.encode()), Some(m));
        assert!(!m.covers(42) && m.covers(41) && !m.covers(43));
        assert_eq!((m.resume_at(42), m.resume_at(43)), (17, 0));
        assert!(Marker::decode("1:2").is_none());
        assert!(Marker::decode("1:2:1:4").is_none());
        assert!(Marker::decode("x:2:1").is_none());
    }
}
