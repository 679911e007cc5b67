//! The replication session protocol (docs/REPLICATION.md, version
//! [`PROTOCOL_VERSION`]) as a sans-I/O codec: [`encode`] appends one
//! framed message to a buffer, a [`FrameDecoder`] takes bytes as they
//! arrive and hands back messages only once they are whole and verified.
//!
//! A frame is `ARPL`, the version (u16 LE), the kind (u16 LE), the payload
//! length (u32 LE, at most [`MAX_PAYLOAD`]), the payload, and a crc32c (u32
//! LE) of everything before it. Control messages carry JSON; a
//! [`Message::Data`] frame carries a piece of a delta stream as it is.

use std::fmt;
use std::str::FromStr;

use arbor_stream::format::{Guid, Header, ResumeToken};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;
/// The frame's first bytes.
pub const MAGIC: [u8; 4] = *b"ARPL";
/// Bytes before a frame's payload.
pub const FRAME_HEADER_LEN: usize = 12;
/// Bytes after it (the crc).
pub const FRAME_CRC_LEN: usize = 4;
/// The largest payload: a data piece, or a control message.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Most snapshots a hello lists (the source's newest).
pub const MAX_SNAPSHOTS: usize = 1024;
/// Most hosts in a replication path.
pub const MAX_PATH: usize = 32;
/// Longest name or identity carried.
pub const MAX_NAME: usize = 256;
/// Longest error message carried.
pub const MAX_MESSAGE: usize = 4096;

const KIND_HELLO: u16 = 1;
const KIND_PLAN: u16 = 2;
const KIND_REFUSE: u16 = 3;
const KIND_BEGIN: u16 = 4;
const KIND_DATA: u16 = 5;
const KIND_DONE: u16 = 6;
const KIND_RECEIVED: u16 = 7;
const KIND_FAILED: u16 = 8;
const KIND_END: u16 = 9;
const KIND_WANT: u16 = 10;
const KIND_BLOCKS: u16 = 11;

/// The bytes of one block healing carries (a checksum block, FORMAT.md
/// §6.4).
pub const HEAL_BLOCK: usize = 4096;
/// Most damaged blocks one session asks its peer for (one want or plan):
/// a pool with more heals the rest in the next sessions.
pub const MAX_WANTED: usize = 4096;
/// Bytes of a blocks frame before its blocks: the identity, the count.
const BLOCKS_HEAD: usize = 16 + 4;
/// Bytes of each block in a blocks frame: its offset, its bytes.
const BLOCK_ENTRY: usize = 8 + HEAL_BLOCK;
/// Most blocks one blocks frame carries.
pub const MAX_BLOCKS_PER_FRAME: usize = (MAX_PAYLOAD - BLOCKS_HEAD) / BLOCK_ENTRY;

/// What is wrong with bytes that should be a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("not an arbor replication peer (bad frame magic)")]
    BadMagic,
    #[error(
        "the peer speaks replication protocol version {0}; this build speaks {PROTOCOL_VERSION}"
    )]
    Version(u16),
    #[error("a frame of unknown kind {0}")]
    UnknownKind(u16),
    #[error("a frame of {0} bytes, more than the limit of {MAX_PAYLOAD}")]
    TooLarge(u32),
    #[error("a frame's checksum does not match (damaged in transit)")]
    Checksum,
    #[error("a malformed {kind} message: {reason}")]
    Malformed { kind: &'static str, reason: String },
}

/// A snapshot as a hello lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    pub guid: WireGuid,
    /// Its name on the source (`vol@snap`), for messages.
    pub name: String,
    /// When the source's master took it (seconds since 1970).
    pub created: u64,
}

/// The source's opening message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The volume on the target.
    pub volume: String,
    /// The source's snapshots of the volume, newest first.
    pub snapshots: Vec<SnapshotEntry>,
    /// The identities of the hosts the snapshots came through, the master
    /// first and the source last: a target finding itself here is a cycle.
    pub path: Vec<String>,
    /// The target already holds a snapshot the source has (seeded by hand):
    /// never start over with a full stream.
    pub seeded: bool,
    /// Roll the target back to the newest common snapshot if it diverged
    /// (`arbor replica resync --force`).
    pub force: bool,
    /// The source heals and is healed (want and blocks messages); a peer
    /// without it never sees them.
    #[serde(default)]
    pub heal: bool,
}

impl Hello {
    /// Checks what the hello announces against the name rules, at
    /// announcement: the volume's name; every snapshot's, which must be of
    /// one volume and stay within the rules under the target's volume name
    /// (the name a received snapshot takes); one name per identity. The
    /// error says which name breaks which rule.
    pub fn check_names(&self) -> Result<(), String> {
        let bad = |what: &str, e: arbor_engine::Error| format!("the source announced {what}: {e}");
        arbor_engine::check_volume_name(&self.volume)
            .map_err(|e| bad(&format!("volume {:?}", self.volume), e))?;
        let mut source_volume = None;
        let mut seen = std::collections::HashSet::new();
        for s in &self.snapshots {
            let what = format!("snapshot {:?}", s.name);
            let (volume, snap) =
                arbor_engine::split_snapshot_name(&s.name).map_err(|e| bad(&what, e))?;
            if *source_volume.get_or_insert(volume) != volume {
                return Err(format!(
                    "the source announced snapshots of two volumes ({:?} and {volume:?}) in one session",
                    source_volume.unwrap_or_default()
                ));
            }
            arbor_engine::split_snapshot_name(&format!("{}@{snap}", self.volume)).map_err(|e| {
                bad(
                    &format!("{what}, to be stored as {}@{snap}", self.volume),
                    e,
                )
            })?;
            if !seen.insert(s.guid) {
                return Err(format!(
                    "the source announced identity {} twice (again as {:?})",
                    s.guid.0, s.name
                ));
            }
        }
        Ok(())
    }

    /// Checks that a stream, by its header, is what the hello announced:
    /// its snapshot an announced identity, under the name and creation
    /// time announced for it, and its base (if incremental) announced as
    /// older. The error says what differs.
    pub fn check_stream(&self, header: &Header) -> Result<(), String> {
        let at = |guid: Guid| self.snapshots.iter().position(|s| s.guid.0 == guid);
        let target = at(header.target).ok_or_else(|| {
            format!(
                "the stream is of snapshot {} ({:?}), which the session did not announce",
                header.target, header.name
            )
        })?;
        let announced = &self.snapshots[target];
        if header.name != announced.name {
            return Err(format!(
                "the stream names its snapshot {:?}, but the session announced identity {} as {:?}",
                header.name, header.target, announced.name
            ));
        }
        if header.creation_time != announced.created {
            return Err(format!(
                "the stream of {:?} says it was taken at {}, but the session announced {}",
                header.name, header.creation_time, announced.created
            ));
        }
        if let Some(base) = header.base {
            // Newest first: an older snapshot comes later.
            if at(base).is_none_or(|b| b <= target) {
                return Err(format!(
                    "the stream of {:?} is a delta against base {base}, which the session did \
                     not announce as an older snapshot",
                    header.name
                ));
            }
        }
        Ok(())
    }
}

/// The target's answer to a hello: where the volume stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The newest of the hello's snapshots the target has.
    pub common: Option<WireGuid>,
    /// A receive in progress into the volume (its resume token).
    pub resume: Option<String>,
    /// Snapshots deleted and changes discarded by a forced resync, for the
    /// report.
    pub rolled_back: Vec<String>,
    /// The target heals and is healed (it answers a hello that says so).
    #[serde(default)]
    pub heal: bool,
    /// The target's damaged blocks in snapshots the hello announced: the
    /// source answers with their bytes (blocks messages) before anything
    /// else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wants: Vec<Wanted>,
}

/// Damaged blocks of one snapshot, by identity: the byte offsets of whole
/// 4 KiB blocks, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wanted {
    pub guid: WireGuid,
    pub offsets: Vec<u64>,
}

/// A peer's ask for good copies of its damaged blocks (after the streams;
/// the source asks, the target answers with blocks messages, then done).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub wants: Vec<Wanted>,
}

/// Good copies of blocks of one snapshot, as the sender reads them
/// (verified against its checksums). Binary: the identity (16 bytes), the
/// count (u32 LE), then each block's offset (u64 LE) and its 4 KiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    pub guid: Guid,
    pub blocks: Vec<(u64, Vec<u8>)>,
}

/// Why a target refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
}

/// The kinds of refusal a source acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The target's configuration does not allow this source for the volume.
    NotAllowed,
    /// The target volume has writes or snapshots not from the source.
    Diverged,
    /// The target would be its own source.
    Cycle,
    /// The target's pool is out of space or metadata.
    NoSpace,
    /// Another session is receiving into the volume.
    Busy,
    /// The stream or the session broke the protocol.
    Protocol,
    /// Anything else (the message says).
    Failed,
}

impl fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefusalCode::NotAllowed => "not allowed",
            RefusalCode::Diverged => "diverged",
            RefusalCode::Cycle => "replication cycle",
            RefusalCode::NoSpace => "target pool full",
            RefusalCode::Busy => "busy",
            RefusalCode::Protocol => "protocol error",
            RefusalCode::Failed => "failed",
        })
    }
}

/// The source starts one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Begin {
    /// Abandon the receive in progress first (the source cannot resume it).
    pub abort_partial: bool,
}

/// The target received one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    pub snapshot: String,
    pub guid: WireGuid,
    /// Stream bytes this session carried.
    pub stream_bytes: u64,
    /// The volume offset the stream resumed from (0: from the start).
    pub resumed_from: u64,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Plan(Plan),
    Refuse(Refusal),
    Begin(Begin),
    /// A piece of the delta stream.
    Data(Vec<u8>),
    /// The stream's last piece has been sent.
    Done,
    Received(Received),
    Failed(Refusal),
    /// The source has nothing more to send.
    End,
    Want(Want),
    Blocks(Blocks),
}

impl Message {
    fn kind(&self) -> u16 {
        match self {
            Message::Hello(_) => KIND_HELLO,
            Message::Plan(_) => KIND_PLAN,
            Message::Refuse(_) => KIND_REFUSE,
            Message::Begin(_) => KIND_BEGIN,
            Message::Data(_) => KIND_DATA,
            Message::Done => KIND_DONE,
            Message::Received(_) => KIND_RECEIVED,
            Message::Failed(_) => KIND_FAILED,
            Message::End => KIND_END,
            Message::Want(_) => KIND_WANT,
            Message::Blocks(_) => KIND_BLOCKS,
        }
    }

    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        kind_name(self.kind())
    }
}

fn kind_name(kind: u16) -> &'static str {
    match kind {
        KIND_HELLO => "hello",
        KIND_PLAN => "plan",
        KIND_REFUSE => "refuse",
        KIND_BEGIN => "begin",
        KIND_DATA => "data",
        KIND_DONE => "done",
        KIND_RECEIVED => "received",
        KIND_FAILED => "failed",
        KIND_END => "end",
        KIND_WANT => "want",
        KIND_BLOCKS => "blocks",
        _ => "unknown",
    }
}

/// A snapshot identity, as 32 hex digits in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireGuid(pub Guid);

impl Serialize for WireGuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for WireGuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let guid = Guid::from_str(&text).map_err(serde::de::Error::custom)?;
        if guid.is_zero() {
            return Err(serde::de::Error::custom("an identity of zeros"));
        }
        Ok(WireGuid(guid))
    }
}

/// Appends `message` as one frame to `out`. Data longer than
/// [`MAX_PAYLOAD`] is the caller's to split (see [`encode_data`]).
pub fn encode(message: &Message, out: &mut Vec<u8>) {
    let payload: Vec<u8> = match message {
        Message::Hello(m) => to_json(m),
        Message::Plan(m) => to_json(m),
        Message::Refuse(m) | Message::Failed(m) => to_json(m),
        Message::Begin(m) => to_json(m),
        Message::Received(m) => to_json(m),
        Message::Data(bytes) => return frame(KIND_DATA, bytes, out),
        Message::Want(m) => to_json(m),
        Message::Blocks(b) => {
            debug_assert!(b.blocks.len() <= MAX_BLOCKS_PER_FRAME);
            let mut payload = Vec::with_capacity(BLOCKS_HEAD + b.blocks.len() * BLOCK_ENTRY);
            payload.extend_from_slice(&b.guid.0);
            // At most MAX_BLOCKS_PER_FRAME: fits a u32.
            payload.extend_from_slice(&(b.blocks.len() as u32).to_le_bytes());
            for (offset, data) in &b.blocks {
                debug_assert_eq!(data.len(), HEAL_BLOCK);
                payload.extend_from_slice(&offset.to_le_bytes());
                payload.extend_from_slice(data);
            }
            payload
        }
        Message::Done | Message::End => Vec::new(),
    };
    frame(message.kind(), &payload, out);
}

/// Appends `bytes` as data frames of at most [`MAX_PAYLOAD`] each.
pub fn encode_data(bytes: &[u8], out: &mut Vec<u8>) {
    for piece in bytes.chunks(MAX_PAYLOAD) {
        frame(KIND_DATA, piece, out);
    }
}

fn frame(kind: u16, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    // MAX_PAYLOAD fits a u32.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// A control message's JSON. Serializing plain structs of strings,
/// numbers and lists cannot fail (serde_json fails only on maps with
/// non-string keys, which these do not have).
fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// Takes bytes as they arrive and hands back whole, verified messages.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed back.
    consumed: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds input.
    pub fn push(&mut self, bytes: &[u8]) {
        // What was handed back goes: the buffer holds at most one frame
        // and one push.
        self.buf.drain(..self.consumed);
        self.consumed = 0;
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet handed back as a message.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.consumed
    }

    /// The next whole message, if one has arrived.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtoError> {
        let rest = &self.buf[self.consumed..];
        if rest.len() < FRAME_HEADER_LEN {
            // A wrong magic is reported as soon as it can be seen.
            let n = rest.len().min(MAGIC.len());
            if rest[..n] != MAGIC[..n] {
                return Err(ProtoError::BadMagic);
            }
            return Ok(None);
        }
        if rest[..4] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([rest[4], rest[5]]);
        if version != PROTOCOL_VERSION {
            return Err(ProtoError::Version(version));
        }
        let kind = u16::from_le_bytes([rest[6], rest[7]]);
        if !(KIND_HELLO..=KIND_BLOCKS).contains(&kind) {
            return Err(ProtoError::UnknownKind(kind));
        }
        let len32 = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let len = usize::try_from(len32)
            .ok()
            .filter(|&l| l <= MAX_PAYLOAD)
            .ok_or(ProtoError::TooLarge(len32))?;
        let total = FRAME_HEADER_LEN + len + FRAME_CRC_LEN;
        if rest.len() < total {
            return Ok(None);
        }
        let body_end = FRAME_HEADER_LEN + len;
        let crc = u32::from_le_bytes([
            rest[body_end],
            rest[body_end + 1],
            rest[body_end + 2],
            rest[body_end + 3],
        ]);
        if crc != crc32c::crc32c(&rest[..body_end]) {
            return Err(ProtoError::Checksum);
        }
        let message = parse(kind, &rest[FRAME_HEADER_LEN..body_end])?;
        self.consumed += total;
        Ok(Some(message))
    }
}

fn malformed(kind: u16, reason: impl fmt::Display) -> ProtoError {
    ProtoError::Malformed {
        kind: kind_name(kind),
        reason: reason.to_string(),
    }
}

fn parse(kind: u16, payload: &[u8]) -> Result<Message, ProtoError> {
    fn json<T: serde::de::DeserializeOwned>(kind: u16, payload: &[u8]) -> Result<T, ProtoError> {
        serde_json::from_slice(payload).map_err(|e| malformed(kind, e))
    }
    let empty = |m: Message| {
        if payload.is_empty() {
            Ok(m)
        } else {
            Err(malformed(kind, "a payload where none belongs"))
        }
    };
    let message = match kind {
        KIND_HELLO => Message::Hello(json(kind, payload)?),
        KIND_PLAN => Message::Plan(json(kind, payload)?),
        KIND_REFUSE => Message::Refuse(json(kind, payload)?),
        KIND_BEGIN => Message::Begin(json(kind, payload)?),
        KIND_DATA => Message::Data(payload.to_vec()),
        KIND_DONE => return empty(Message::Done),
        KIND_RECEIVED => Message::Received(json(kind, payload)?),
        KIND_FAILED => Message::Failed(json(kind, payload)?),
        KIND_END => return empty(Message::End),
        KIND_WANT => Message::Want(json(kind, payload)?),
        KIND_BLOCKS => Message::Blocks(parse_blocks(payload).map_err(|e| malformed(kind, e))?),
        other => return Err(ProtoError::UnknownKind(other)),
    };
    check_limits(kind, &message)?;
    Ok(message)
}

/// A blocks frame's payload: every length exact, every offset a whole
/// block's.
fn parse_blocks(payload: &[u8]) -> Result<Blocks, String> {
    let (head, rest) = payload
        .split_at_checked(BLOCKS_HEAD)
        .ok_or("shorter than its header")?;
    let mut guid = [0u8; 16];
    guid.copy_from_slice(&head[..16]);
    let count = u32::from_le_bytes([head[16], head[17], head[18], head[19]]) as usize;
    if count > MAX_BLOCKS_PER_FRAME {
        return Err(format!("{count} blocks, more than {MAX_BLOCKS_PER_FRAME}"));
    }
    if rest.len() != count * BLOCK_ENTRY {
        return Err(format!(
            "{} bytes of blocks for a count of {count}",
            rest.len()
        ));
    }
    let guid = Guid(guid);
    if guid.is_zero() {
        return Err("an identity of zeros".into());
    }
    let mut blocks = Vec::with_capacity(count);
    for entry in rest.chunks_exact(BLOCK_ENTRY) {
        let mut at = [0u8; 8];
        at.copy_from_slice(&entry[..8]);
        let offset = u64::from_le_bytes(at);
        if !offset.is_multiple_of(HEAL_BLOCK as u64) {
            return Err(format!("block offset {offset} is not a whole block's"));
        }
        blocks.push((offset, entry[8..].to_vec()));
    }
    Ok(Blocks { guid, blocks })
}

/// Checks a list of wanted blocks against the limits.
fn check_wanted(wants: &[Wanted]) -> Result<(), String> {
    if wants.len() > MAX_SNAPSHOTS {
        return Err(format!("blocks of more than {MAX_SNAPSHOTS} snapshots"));
    }
    let total: usize = wants.iter().map(|w| w.offsets.len()).sum();
    if total > MAX_WANTED {
        return Err(format!("{total} blocks wanted, more than {MAX_WANTED}"));
    }
    for w in wants {
        if let Some(o) = w
            .offsets
            .iter()
            .find(|o| !o.is_multiple_of(HEAL_BLOCK as u64))
        {
            return Err(format!("block offset {o} is not a whole block's"));
        }
    }
    Ok(())
}

/// Every list and string a peer sends has a stated limit.
fn check_limits(kind: u16, message: &Message) -> Result<(), ProtoError> {
    let name = |s: &str, what: &str| {
        if s.len() > MAX_NAME {
            Err(malformed(
                kind,
                format!("{what} longer than {MAX_NAME} bytes"),
            ))
        } else {
            Ok(())
        }
    };
    match message {
        Message::Hello(h) => {
            name(&h.volume, "the volume name")?;
            if h.snapshots.len() > MAX_SNAPSHOTS {
                return Err(malformed(
                    kind,
                    format!("more than {MAX_SNAPSHOTS} snapshots"),
                ));
            }
            for s in &h.snapshots {
                name(&s.name, "a snapshot name")?;
            }
            if h.path.is_empty() || h.path.len() > MAX_PATH {
                return Err(malformed(
                    kind,
                    format!("a path of 1 to {MAX_PATH} hosts expected"),
                ));
            }
            for host in &h.path {
                name(host, "a host identity")?;
            }
        }
        Message::Plan(p) => {
            if let Some(token) = &p.resume {
                ResumeToken::decode(token).map_err(|e| malformed(kind, e))?;
            }
            if p.rolled_back.len() > MAX_SNAPSHOTS {
                return Err(malformed(kind, "too many rolled-back snapshots"));
            }
            for s in &p.rolled_back {
                name(s, "a snapshot name")?;
            }
            check_wanted(&p.wants).map_err(|e| malformed(kind, e))?;
        }
        Message::Want(w) => check_wanted(&w.wants).map_err(|e| malformed(kind, e))?,
        Message::Refuse(r) | Message::Failed(r) => {
            if r.message.len() > MAX_MESSAGE {
                return Err(malformed(kind, "a message longer than 4096 bytes"));
            }
        }
        Message::Received(r) => name(&r.snapshot, "the snapshot name")?,
        Message::Begin(_)
        | Message::Data(_)
        | Message::Done
        | Message::End
        | Message::Blocks(_) => {}
    }
    Ok(())
}

/// Cuts `message` to what a refusal may carry, at a character boundary.
pub fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guid(n: u8) -> WireGuid {
        WireGuid(Guid([n; 16]))
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                volume: "vm1".into(),
                snapshots: vec![SnapshotEntry {
                    guid: guid(7),
                    name: "vm1@a".into(),
                    created: 5,
                }],
                path: vec!["alpha".into()],
                seeded: true,
                force: false,
                heal: true,
            }),
            Message::Plan(Plan {
                common: Some(guid(7)),
                resume: None,
                rolled_back: vec!["vm1@x".into()],
                heal: true,
                wants: vec![Wanted {
                    guid: guid(7),
                    offsets: vec![0, 8192],
                }],
            }),
            Message::Want(Want {
                wants: vec![Wanted {
                    guid: guid(8),
                    offsets: vec![4096],
                }],
            }),
            Message::Blocks(Blocks {
                guid: Guid([8; 16]),
                blocks: vec![(4096, vec![3; HEAL_BLOCK]), (1 << 40, vec![4; HEAL_BLOCK])],
            }),
            Message::Blocks(Blocks {
                guid: Guid([8; 16]),
                blocks: Vec::new(),
            }),
            Message::Refuse(Refusal {
                code: RefusalCode::Diverged,
                message: "no".into(),
            }),
            Message::Begin(Begin {
                abort_partial: true,
            }),
            Message::Data(vec![1, 2, 3]),
            Message::Data(Vec::new()),
            Message::Done,
            Message::Received(Received {
                snapshot: "vm1@a".into(),
                guid: guid(9),
                stream_bytes: 10,
                resumed_from: 0,
            }),
            Message::Failed(Refusal {
                code: RefusalCode::NoSpace,
                message: "full".into(),
            }),
            Message::End,
        ]
    }

    #[test]
    fn every_message_round_trips_whole_and_byte_by_byte() {
        let mut wire = Vec::new();
        for m in samples() {
            encode(&m, &mut wire);
        }
        let mut whole = FrameDecoder::new();
        whole.push(&wire);
        let mut slow = FrameDecoder::new();
        let mut got = Vec::new();
        for b in &wire {
            slow.push(std::slice::from_ref(b));
            while let Some(m) = slow.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, samples());
        for m in samples() {
            assert_eq!(whole.next_message().unwrap(), Some(m));
        }
        assert_eq!(whole.next_message().unwrap(), None);
        assert_eq!(whole.buffered(), 0);
    }

    #[test]
    fn damage_is_refused_never_misread() {
        let mut wire = Vec::new();
        encode(&samples()[0], &mut wire);
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x10;
            let mut d = FrameDecoder::new();
            d.push(&bad);
            // A flipped length may just wait for more bytes; never a message.
            assert!(!matches!(d.next_message(), Ok(Some(_))), "byte {i}");
        }
        let mut d = FrameDecoder::new();
        d.push(b"GET / HTTP/1.1\r\n");
        assert_eq!(d.next_message(), Err(ProtoError::BadMagic));
        let mut d = FrameDecoder::new();
        d.push(b"AR");
        assert_eq!(d.next_message(), Ok(None));
        d.push(b"X");
        assert_eq!(d.next_message(), Err(ProtoError::BadMagic));
    }

    /// Healing messages: a full blocks frame fits a frame; lengths,
    /// counts, offsets and lists are checked; a peer that predates healing
    /// (no `heal` in its hello or plan) is read as one that does not heal.
    #[test]
    fn healing_messages_are_bounded_and_optional() {
        let full = Blocks {
            guid: Guid([1; 16]),
            blocks: (0..MAX_BLOCKS_PER_FRAME as u64)
                .map(|i| (i * 4096, vec![i as u8; HEAL_BLOCK]))
                .collect(),
        };
        let mut wire = Vec::new();
        encode(&Message::Blocks(full.clone()), &mut wire);
        assert!(wire.len() <= FRAME_HEADER_LEN + MAX_PAYLOAD + FRAME_CRC_LEN);
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert_eq!(d.next_message().unwrap(), Some(Message::Blocks(full)));
        let bad = |payload: &[u8]| {
            let mut wire = Vec::new();
            frame(KIND_BLOCKS, payload, &mut wire);
            let mut d = FrameDecoder::new();
            d.push(&wire);
            d.next_message()
        };
        let one = |offset: u64, count: u32, data: usize| {
            let mut p = vec![1u8; 16];
            p.extend_from_slice(&count.to_le_bytes());
            p.extend_from_slice(&offset.to_le_bytes());
            p.extend_from_slice(&vec![0u8; data]);
            p
        };
        assert!(matches!(bad(&one(4096, 1, HEAL_BLOCK)), Ok(Some(_))));
        for payload in [
            one(100, 1, HEAL_BLOCK),      // not a whole block's offset
            one(4096, 2, HEAL_BLOCK),     // count beyond the bytes
            one(4096, 1, HEAL_BLOCK - 1), // a short block
            one(4096, u32::MAX, HEAL_BLOCK),
            vec![0u8; 19], // shorter than the header
            [vec![0u8; 16], one(0, 0, 0)[16..20].to_vec()].concat(), // zero identity
        ] {
            assert!(
                matches!(bad(&payload), Err(ProtoError::Malformed { .. })),
                "{:?}",
                &payload[..payload.len().min(24)]
            );
        }
        let want = |offsets: Vec<u64>| {
            let mut wire = Vec::new();
            encode(
                &Message::Want(Want {
                    wants: vec![Wanted {
                        guid: guid(2),
                        offsets,
                    }],
                }),
                &mut wire,
            );
            let mut d = FrameDecoder::new();
            d.push(&wire);
            d.next_message()
        };
        assert!(want(vec![0; MAX_WANTED]).is_ok());
        assert!(matches!(
            want(vec![0; MAX_WANTED + 1]),
            Err(ProtoError::Malformed { .. })
        ));
        assert!(matches!(want(vec![512]), Err(ProtoError::Malformed { .. })));
        // An older peer's hello and plan.
        let mut wire = Vec::new();
        frame(
            KIND_HELLO,
            br#"{"volume":"v","snapshots":[],"path":["a"],"seeded":false,"force":false}"#,
            &mut wire,
        );
        frame(
            KIND_PLAN,
            br#"{"common":null,"resume":null,"rolled_back":[]}"#,
            &mut wire,
        );
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert!(matches!(
            d.next_message(),
            Ok(Some(Message::Hello(Hello { heal: false, .. })))
        ));
        assert!(matches!(
            d.next_message(),
            Ok(Some(Message::Plan(Plan { heal: false, ref wants, .. }))) if wants.is_empty()
        ));
    }

    #[test]
    fn lengths_and_lists_have_limits() {
        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        header.extend_from_slice(&KIND_DATA.to_le_bytes());
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut d = FrameDecoder::new();
        d.push(&header);
        assert_eq!(d.next_message(), Err(ProtoError::TooLarge(u32::MAX)));

        let many = Hello {
            volume: "v".into(),
            snapshots: (0..=MAX_SNAPSHOTS)
                .map(|i| SnapshotEntry {
                    guid: guid(1),
                    name: format!("v@{i}"),
                    created: 0,
                })
                .collect(),
            path: vec!["a".into()],
            seeded: false,
            force: false,
            heal: false,
        };
        let mut wire = Vec::new();
        encode(&Message::Hello(many), &mut wire);
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert!(matches!(
            d.next_message(),
            Err(ProtoError::Malformed { .. })
        ));

        let mut wire = Vec::new();
        frame(KIND_HELLO, br#"{"volume":"v","snapshots":[{"guid":"00000000000000000000000000000000","name":"v@a","created":0}],"path":["a"],"seeded":false,"force":false}"#, &mut wire);
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert!(matches!(
            d.next_message(),
            Err(ProtoError::Malformed { .. })
        ));
    }

    #[test]
    fn other_versions_and_kinds_are_named() {
        let mut wire = Vec::new();
        encode(&Message::End, &mut wire);
        wire[4] = 2;
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert_eq!(d.next_message(), Err(ProtoError::Version(2)));
        let mut wire = Vec::new();
        frame(77, &[], &mut wire);
        let mut d = FrameDecoder::new();
        d.push(&wire);
        assert_eq!(d.next_message(), Err(ProtoError::UnknownKind(77)));
    }

    #[test]
    fn data_is_split_into_frames_within_the_limit() {
        let bytes = vec![5u8; MAX_PAYLOAD * 2 + 3];
        let mut wire = Vec::new();
        encode_data(&bytes, &mut wire);
        let mut d = FrameDecoder::new();
        d.push(&wire);
        let mut back = Vec::new();
        while let Some(Message::Data(piece)) = d.next_message().unwrap() {
            assert!(piece.len() <= MAX_PAYLOAD);
            back.extend(piece);
        }
        assert_eq!(back, bytes);
    }

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let long = "é".repeat(MAX_MESSAGE);
        let cut = bounded_message(&long);
        assert!(cut.len() <= MAX_MESSAGE && cut.ends_with("..."));
    }
}
