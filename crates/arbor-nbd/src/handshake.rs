//! The fixed newstyle handshake as a sans-I/O state machine.
//!
//! The driver sends [`greeting`], then repeatedly reads exactly
//! [`Handshake::wanted`] bytes, passes them to [`Handshake::receive`] and
//! sends the reply bytes of the returned [`Step`], until a step says to
//! enter transmission or to close. A [`HandshakeError`] means the client
//! broke the protocol badly enough that the connection must be dropped;
//! everything else (unknown options, malformed option payloads, unknown
//! exports) is answered with an error reply so the client can carry on.

use std::sync::Arc;

use crate::export::{Export, ExportError, ExportProvider};
use crate::proto::{
    client_flags, handshake_flags, info, option, option_reply, transmission_flags, truncate_text,
    ByteReader, BASE_ALLOCATION, BASE_ALLOCATION_ID, BASE_NAMESPACE, CLIENT_FLAGS_LEN,
    EXPORT_NAME_PADDING, GREETING_LEN, IHAVEOPT, MAX_OPTION_LEN, MAX_PAYLOAD, MAX_STRING_LEN,
    MIN_BLOCK_SIZE, NBD_MAGIC, OPTION_HEADER_LEN, OPTION_REPLY_MAGIC, PREFERRED_BLOCK_SIZE,
};

/// The first bytes the server sends on a new connection.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
    out[16..].copy_from_slice(&flags.to_be_bytes());
    out
}

/// A protocol violation that ends the connection without a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("client set flags {0:#x} this server did not offer")]
    UnknownClientFlags(u32),
    #[error("option header has magic {0:#018x} instead of IHAVEOPT")]
    BadOptionMagic(u64),
    #[error("option {code} carries {len} bytes, over the {MAX_OPTION_LEN}-byte limit")]
    OptionTooLong { code: u32, len: u32 },
    #[error(
        "NBD_OPT_EXPORT_NAME for {name:?} failed ({source}); that option cannot report errors"
    )]
    ExportNameRefused { name: String, source: ExportError },
    #[error("driver passed {got} bytes where {wanted} were wanted")]
    WrongInputLength { wanted: usize, got: usize },
}

/// What the driver does after [`Handshake::receive`]: send `reply` (possibly
/// empty) and then continue, enter transmission, or close.
pub enum Step {
    Continue { reply: Vec<u8> },
    Transmit { reply: Vec<u8>, session: Session },
    Close { reply: Vec<u8> },
}

/// Everything negotiated for the transmission phase.
#[derive(Clone)]
pub struct Session {
    pub export_name: String,
    pub export: Arc<dyn Export>,
    /// Export size as advertised: fixed for the life of the connection.
    pub size: u64,
    pub read_only: bool,
    pub transmission_flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export, enabling block status.
    pub base_allocation: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("export_name", &self.export_name)
            .field("size", &self.size)
            .field("read_only", &self.read_only)
            .field("transmission_flags", &self.transmission_flags)
            .field("structured", &self.structured)
            .field("base_allocation", &self.base_allocation)
            .finish_non_exhaustive()
    }
}

/// Transmission flags for an export, advertised truthfully: write-type
/// commands only for writable exports, `DF` only with structured replies.
pub fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    use transmission_flags::*;
    let mut flags = HAS_FLAGS | SEND_FLUSH | SEND_CACHE | CAN_MULTI_CONN;
    flags |= if read_only {
        READ_ONLY
    } else {
        SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | SEND_FAST_ZERO
    };
    if structured {
        flags |= SEND_DF;
    }
    flags
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    ClientFlags,
    OptionHeader,
    OptionData { code: u32, len: usize },
}

/// Handshake state of one connection.
#[derive(Debug)]
pub struct Handshake {
    expect: Expect,
    no_zeroes: bool,
    structured: bool,
    /// Export for which the last `NBD_OPT_SET_META_CONTEXT` selected
    /// `base:allocation`; block status is enabled only if the client then
    /// opens this same export.
    base_allocation_for: Option<String>,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    pub fn new() -> Self {
        Self {
            expect: Expect::ClientFlags,
            no_zeroes: false,
            structured: false,
            base_allocation_for: None,
        }
    }

    /// Exactly how many bytes the next [`receive`](Self::receive) needs.
    pub fn wanted(&self) -> usize {
        match self.expect {
            Expect::ClientFlags => CLIENT_FLAGS_LEN,
            Expect::OptionHeader => OPTION_HEADER_LEN,
            Expect::OptionData { len, .. } => len,
        }
    }

    /// Consumes exactly [`wanted`](Self::wanted) bytes. `exports` is consulted
    /// for options naming an export; it may block, so drivers call this off
    /// the async runtime.
    pub fn receive(
        &mut self,
        input: &[u8],
        exports: &dyn ExportProvider,
    ) -> Result<Step, HandshakeError> {
        let wanted = self.wanted();
        if input.len() != wanted {
            return Err(HandshakeError::WrongInputLength {
                wanted,
                got: input.len(),
            });
        }
        match self.expect {
            Expect::ClientFlags => self.on_client_flags(input),
            Expect::OptionHeader => self.on_option_header(input),
            Expect::OptionData { code, .. } => {
                self.expect = Expect::OptionHeader;
                self.on_option(code, input, exports)
            }
        }
    }

    fn on_client_flags(&mut self, input: &[u8]) -> Result<Step, HandshakeError> {
        let flags = ByteReader::new(input).u32().unwrap_or(u32::MAX);
        if flags & !client_flags::KNOWN != 0 {
            return Err(HandshakeError::UnknownClientFlags(flags));
        }
        // A client without FIXED_NEWSTYLE only ever sends NBD_OPT_EXPORT_NAME,
        // which gets the same answer either way, so it needs no special case.
        self.no_zeroes = flags & client_flags::NO_ZEROES != 0;
        self.expect = Expect::OptionHeader;
        Ok(Step::Continue { reply: Vec::new() })
    }

    fn on_option_header(&mut self, input: &[u8]) -> Result<Step, HandshakeError> {
        let mut reader = ByteReader::new(input);
        let (magic, code, len) = match (reader.u64(), reader.u32(), reader.u32()) {
            (Some(magic), Some(code), Some(len)) => (magic, code, len),
            // Unreachable: `receive` checked the length.
            _ => return Err(self.wrong_length(input)),
        };
        if magic != IHAVEOPT {
            return Err(HandshakeError::BadOptionMagic(magic));
        }
        if len > MAX_OPTION_LEN {
            return Err(HandshakeError::OptionTooLong { code, len });
        }
        // `len <= MAX_OPTION_LEN` (64 KiB) fits any usize.
        let len = len as usize;
        // A zero-length option is answered on the driver's next call, which
        // reads zero bytes.
        self.expect = Expect::OptionData { code, len };
        Ok(Step::Continue { reply: Vec::new() })
    }

    fn wrong_length(&self, input: &[u8]) -> HandshakeError {
        HandshakeError::WrongInputLength {
            wanted: self.wanted(),
            got: input.len(),
        }
    }

    fn on_option(
        &mut self,
        code: u32,
        data: &[u8],
        exports: &dyn ExportProvider,
    ) -> Result<Step, HandshakeError> {
        let mut replies = Replies::new(code);
        match code {
            option::EXPORT_NAME => return self.export_name(data, exports),
            option::ABORT => {
                // The spec says to ignore any data sent with ABORT.
                replies.ack();
                return Ok(Step::Close {
                    reply: replies.into_bytes(),
                });
            }
            option::LIST => list(data, exports, &mut replies),
            option::INFO | option::GO => {
                if let Some(session) = self.info_or_go(data, exports, &mut replies) {
                    if code == option::GO {
                        return Ok(Step::Transmit {
                            reply: replies.into_bytes(),
                            session,
                        });
                    }
                }
            }
            option::STRUCTURED_REPLY => self.structured_reply(data, &mut replies),
            option::LIST_META_CONTEXT => self.list_meta_context(data, exports, &mut replies),
            option::SET_META_CONTEXT => self.set_meta_context(data, exports, &mut replies),
            _ => replies.error(
                option_reply::ERR_UNSUP,
                "option not supported by this server",
            ),
        }
        Ok(Step::Continue {
            reply: replies.into_bytes(),
        })
    }

    fn export_name(
        &mut self,
        data: &[u8],
        exports: &dyn ExportProvider,
    ) -> Result<Step, HandshakeError> {
        let name = ByteReader::new(data).string(data.len());
        let opened = match name {
            Some(name) => self.open_session(name, exports),
            None => Err(ExportError::Invalid("export name is not valid text".into())),
        };
        let session = opened.map_err(|source| HandshakeError::ExportNameRefused {
            name: String::from_utf8_lossy(data).into_owned(),
            source,
        })?;
        let mut reply = Vec::with_capacity(10 + EXPORT_NAME_PADDING);
        reply.extend_from_slice(&session.size.to_be_bytes());
        reply.extend_from_slice(&session.transmission_flags.to_be_bytes());
        if !self.no_zeroes {
            reply.resize(reply.len() + EXPORT_NAME_PADDING, 0);
        }
        Ok(Step::Transmit { reply, session })
    }

    /// Answers `NBD_OPT_INFO`/`NBD_OPT_GO`; returns the session on success.
    fn info_or_go(
        &mut self,
        data: &[u8],
        exports: &dyn ExportProvider,
        replies: &mut Replies,
    ) -> Option<Session> {
        let Some(request) = InfoRequest::parse(data) else {
            replies.error(
                option_reply::ERR_INVALID,
                "malformed NBD_OPT_INFO/GO payload",
            );
            return None;
        };
        let session = match self.open_session(request.name, exports) {
            Ok(session) => session,
            Err(error) => {
                replies.error(option_reply::ERR_UNKNOWN, &error.to_string());
                return None;
            }
        };
        let mut export_info = info::EXPORT.to_be_bytes().to_vec();
        export_info.extend_from_slice(&session.size.to_be_bytes());
        export_info.extend_from_slice(&session.transmission_flags.to_be_bytes());
        replies.push(option_reply::INFO, &export_info);
        // Always sent, requested or not: our minimum block size is not the
        // protocol default of 1, so the spec asks us to advertise it.
        replies.push(option_reply::INFO, &block_size_info());
        if request.wants(info::NAME) {
            replies.push(option_reply::INFO, &text_info(info::NAME, request.name));
        }
        if request.wants(info::DESCRIPTION) {
            let description = session.export.description();
            replies.push(
                option_reply::INFO,
                &text_info(info::DESCRIPTION, truncate_text(&description)),
            );
        }
        replies.ack();
        Some(session)
    }

    fn structured_reply(&mut self, data: &[u8], replies: &mut Replies) {
        if !data.is_empty() {
            replies.error(
                option_reply::ERR_INVALID,
                "NBD_OPT_STRUCTURED_REPLY takes no data",
            );
            return;
        }
        self.structured = true;
        replies.ack();
    }

    fn list_meta_context(
        &mut self,
        data: &[u8],
        exports: &dyn ExportProvider,
        replies: &mut Replies,
    ) {
        let Some(request) = MetaContextRequest::parse(data) else {
            replies.error(option_reply::ERR_INVALID, "malformed meta context request");
            return;
        };
        if let Err(error) = exports.open(request.export) {
            replies.error(option_reply::ERR_UNKNOWN, &error.to_string());
            return;
        }
        // No query lists everything; "base:" is the namespace wildcard.
        let listed = request.queries.is_empty()
            || request
                .queries
                .iter()
                .any(|query| *query == BASE_NAMESPACE || *query == BASE_ALLOCATION);
        if listed {
            // Ids in a listing are reserved and should be zero.
            replies.push(
                option_reply::META_CONTEXT,
                &meta_context(0, BASE_ALLOCATION),
            );
        }
        replies.ack();
    }

    fn set_meta_context(
        &mut self,
        data: &[u8],
        exports: &dyn ExportProvider,
        replies: &mut Replies,
    ) {
        // The selection is replaced even when this request fails.
        self.base_allocation_for = None;
        if !self.structured {
            replies.error(
                option_reply::ERR_INVALID,
                "negotiate structured replies before meta contexts",
            );
            return;
        }
        let Some(request) = MetaContextRequest::parse(data) else {
            replies.error(option_reply::ERR_INVALID, "malformed meta context request");
            return;
        };
        if let Err(error) = exports.open(request.export) {
            replies.error(option_reply::ERR_UNKNOWN, &error.to_string());
            return;
        }
        // Unknown namespaces and leaves, and the bare "base:" wildcard, are
        // ignored as the spec requires.
        if request.queries.contains(&BASE_ALLOCATION) {
            replies.push(
                option_reply::META_CONTEXT,
                &meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION),
            );
            self.base_allocation_for = Some(request.export.to_owned());
        }
        replies.ack();
    }

    fn open_session(
        &self,
        name: &str,
        exports: &dyn ExportProvider,
    ) -> Result<Session, ExportError> {
        let export = exports.open(name)?;
        let read_only = export.read_only();
        // Only whole minimum blocks are addressable, so the tail of an
        // unaligned export is not advertised.
        let size = export.size();
        let size = size - size % u64::from(MIN_BLOCK_SIZE);
        Ok(Session {
            export_name: name.to_owned(),
            export,
            size,
            read_only,
            transmission_flags: transmission_flags(read_only, self.structured),
            structured: self.structured,
            base_allocation: self.base_allocation_for.as_deref() == Some(name),
        })
    }
}

fn list(data: &[u8], exports: &dyn ExportProvider, replies: &mut Replies) {
    if !data.is_empty() {
        replies.error(option_reply::ERR_INVALID, "NBD_OPT_LIST takes no data");
        return;
    }
    for listing in exports.list() {
        if listing.name.len() > MAX_STRING_LEN {
            tracing::warn!(name = %listing.name, "export name too long to list");
            continue;
        }
        let mut server = Vec::new();
        push_prefixed(&mut server, listing.name.as_bytes());
        server.extend_from_slice(truncate_text(&listing.description).as_bytes());
        replies.push(option_reply::SERVER, &server);
    }
    replies.ack();
}

/// Payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, PartialEq, Eq)]
struct InfoRequest<'a> {
    name: &'a str,
    requests: Vec<u16>,
}

impl<'a> InfoRequest<'a> {
    fn parse(data: &'a [u8]) -> Option<Self> {
        let mut reader = ByteReader::new(data);
        let name = reader.prefixed_string()?;
        let count = reader.u16()?;
        let requests = (0..count)
            .map(|_| reader.u16())
            .collect::<Option<Vec<_>>>()?;
        reader.is_empty().then_some(Self { name, requests })
    }

    fn wants(&self, info_type: u16) -> bool {
        self.requests.contains(&info_type)
    }
}

/// Payload of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, PartialEq, Eq)]
struct MetaContextRequest<'a> {
    export: &'a str,
    queries: Vec<&'a str>,
}

impl<'a> MetaContextRequest<'a> {
    fn parse(data: &'a [u8]) -> Option<Self> {
        let mut reader = ByteReader::new(data);
        let export = reader.prefixed_string()?;
        let count = reader.u32()?;
        // Each query takes at least 4 bytes, so a lying count fails within
        // MAX_OPTION_LEN / 4 iterations.
        let queries = (0..count)
            .map(|_| reader.prefixed_string())
            .collect::<Option<Vec<_>>>()?;
        reader.is_empty().then_some(Self { export, queries })
    }
}

/// Accumulates the option replies answering one option.
struct Replies {
    code: u32,
    bytes: Vec<u8>,
}

impl Replies {
    fn new(code: u32) -> Self {
        Self {
            code,
            bytes: Vec::new(),
        }
    }

    /// Appends one reply. Callers keep `data` below 64 KiB (strings are
    /// capped at [`MAX_STRING_LEN`]), so its length always fits the u32 field.
    fn push(&mut self, reply_type: u32, data: &[u8]) {
        self.bytes
            .extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        self.bytes.extend_from_slice(&self.code.to_be_bytes());
        self.bytes.extend_from_slice(&reply_type.to_be_bytes());
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&len.to_be_bytes());
        self.bytes.extend_from_slice(data);
    }

    fn ack(&mut self) {
        self.push(option_reply::ACK, &[]);
    }

    fn error(&mut self, reply_type: u32, message: &str) {
        self.push(reply_type, truncate_text(message).as_bytes());
    }

    fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

fn block_size_info() -> Vec<u8> {
    let mut out = info::BLOCK_SIZE.to_be_bytes().to_vec();
    for size in [MIN_BLOCK_SIZE, PREFERRED_BLOCK_SIZE, MAX_PAYLOAD] {
        out.extend_from_slice(&size.to_be_bytes());
    }
    out
}

fn text_info(info_type: u16, text: &str) -> Vec<u8> {
    let mut out = info_type.to_be_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(name.as_bytes());
    out
}

fn push_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    // Callers pass at most MAX_STRING_LEN bytes.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}
