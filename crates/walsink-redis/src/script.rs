//! The server-side script that applies one chunk of an epoch and moves the commit marker in
//! one atomic step, and the marker's encoding.
//!
//! The marker is a field of the hash `walsink:{TAG}:committed` per sink id and subtask,
//! `SINK/SUBTASK`, holding `CHECKPOINT:NEXT:DONE`: the epoch being applied (its id padded
//! to 20 digits, so ids compare as strings inside Lua, whose numbers are doubles), the index
//! of its first record not applied yet, and `1` once the whole epoch is applied. The field
//! `SINK/SUBTASK:meta` holds `CHECKPOINT\nMETADATA` of the newest complete epoch.
//!
//! For each chunk the script:
//! 1. reads the marker; an epoch already complete (or older than the marker) is skipped;
//! 2. skips the records of the chunk the marker says were applied (a resume after a crash in
//!    the middle of an epoch, even if chunk limits changed in between); a chunk that starts
//!    after the marker's next index is a gap and an error (`WALSINK_GAP`);
//! 3. refuses a data key of another type with `WRONGTYPE` *before* writing anything;
//! 4. applies the rest of the chunk's records and moves the marker (and, on the last chunk,
//!    stores the metadata).
//!
//! Redis runs a script alone, and it writes nothing before its checks pass, so a chunk is
//! applied with its marker or not at all.

/// The Lua source.
///
/// `KEYS[1]` data key, `KEYS[2]` marker hash; `ARGV[1]` marker field, `ARGV[2]` checkpoint
/// (20 digits), `ARGV[3]` index of the chunk's first record, `ARGV[4]` `1` on the epoch's
/// last chunk, `ARGV[5]` mode, `ARGV[6]` metadata (last chunk only), `ARGV[7..]` the
/// records (in hash mode a field and a value per record). Returns `{applied, next}`.
pub const SOURCE: &str = r#"
local field = ARGV[1]
local cp = ARGV[2]
local first = tonumber(ARGV[3])
local last = ARGV[4] == '1'
local mode = ARGV[5]
local width = 1
if mode == 'hash' then width = 2 end
local n = (#ARGV - 6) / width
local cur = redis.call('HGET', KEYS[2], field)
local skip = 0
if cur then
  local mcp, mnext, mdone = string.match(cur, '^(%d+):(%d+):([01])$')
  if not mcp then
    return redis.error_reply('WALSINK_MARKER ' .. KEYS[2] .. ' field ' .. field .. ' holds ' .. cur .. ', not a walsink marker')
  end
  mnext = tonumber(mnext)
  if mcp > cp or (mcp == cp and mdone == '1') then
    return {0, mnext}
  end
  if mcp == cp then
    if first > mnext then
      return redis.error_reply('WALSINK_GAP checkpoint ' .. cp .. ': chunk from record ' .. first .. ' but the marker is at record ' .. mnext)
    end
    skip = mnext - first
    if skip > n or (skip == n and not last) then
      return {0, mnext}
    end
  elseif first > 0 then
    return redis.error_reply('WALSINK_GAP checkpoint ' .. cp .. ': chunk from record ' .. first .. ' but the epoch was never started')
  end
elseif first > 0 then
  return redis.error_reply('WALSINK_GAP checkpoint ' .. cp .. ': chunk from record ' .. first .. ' but there is no marker')
end
if skip < n then
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t ~= 'none' and t ~= mode then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' holds a ' .. t .. ', the sink writes a ' .. mode)
  end
  local key = KEYS[1]
  if mode == 'list' then
    local i = 7 + skip
    local stop = 6 + n
    while i <= stop do
      local j = math.min(i + 999, stop)
      redis.call('RPUSH', key, unpack(ARGV, i, j))
      i = j + 1
    end
  elseif mode == 'stream' then
    for i = 7 + skip, 6 + n do
      redis.call('XADD', key, '*', 'record', ARGV[i])
    end
  else
    local i = 7 + 2 * skip
    local stop = 6 + 2 * n
    while i <= stop do
      local j = math.min(i + 999, stop)
      redis.call('HSET', key, unpack(ARGV, i, j))
      i = j + 1
    end
  end
end
local nextidx = first + n
if last then
  redis.call('HSET', KEYS[2], field, cp .. ':' .. nextidx .. ':1', field .. ':meta', cp .. '\n' .. ARGV[6])
else
  redis.call('HSET', KEYS[2], field, cp .. ':' .. nextidx .. ':0')
end
return {1, nextidx}
"#;

/// The marker field of a sink id and subtask.
pub fn field(sink_id: &str, subtask: u32) -> String {
    format!("{sink_id}/{subtask}")
}

/// A checkpoint id as the script compares it.
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
        assert!(!m.covers(42) && m.covers(41) && !m.covers(43));
        assert_eq!((m.resume_at(42), m.resume_at(43)), (17, 0));
        assert!(Marker::decode("1:2").is_none());
        assert!(Marker::decode("1:2:1:4").is_none());
        assert!(Marker::decode("x:2:1").is_none());
    }
}
