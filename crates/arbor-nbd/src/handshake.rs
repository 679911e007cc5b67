//! The fixed newstyle handshake as a sans-I/O state machine.
//!
//! The driver sends [`greeting`], then repeatedly reads exactly
//! [`Handshake::wanted`] bytes, passes them to [`Handshake::receive`] and
//! sends the reply bytes of the returned [`Step`], until a step says to
//! enter transmission or to close. A [`HandshakeError`] means the client
//! broke the protocol badly enough that the connection must be dropped;
//! everything else (unknown options, malformed option payloads, unknown
//! exports) is answered with an error reply so the client can carry on.
//!
//! TLS follows the spec's "TLS support" section: [`TlsMode::Off`] is its
//! NOTLS mode, [`TlsMode::On`] SELECTIVETLS (TLS at the client's choice;
//! exports only certificate holders are granted need it) and
//! [`TlsMode::Require`] FORCEDTLS. `NBD_OPT_STARTTLS` yields
//! [`Step::StartTls`]; the driver sends the reply, runs the TLS handshake
//! and reports the result with [`Handshake::tls_established`], which
//! forgets everything negotiated before. What a client may open is decided
//! by the listener's [`AccessList`] for the client's identity.

use std::sync::Arc;

use crate::access::{Access, AccessList, Client};
use crate::export::{Export, ExportError, ExportProvider};
use crate::proto::{
    client_flags, handshake_flags, info, option, option_reply, transmission_flags, truncate_text,
    ByteReader, MetaContext, BASE_ALLOCATION, BASE_ALLOCATION_ID, BASE_NAMESPACE, CLIENT_FLAGS_LEN,
    EXPORT_NAME_PADDING, GREETING_LEN, IHAVEOPT, MAX_META_CONTEXTS, MAX_OPTION_LEN, MAX_PAYLOAD,
    MAX_STRING_LEN, MIN_BLOCK_SIZE, NBD_MAGIC, OPTION_HEADER_LEN, OPTION_REPLY_MAGIC,
    PREFERRED_BLOCK_SIZE,
};
use crate::transmission::Framing;

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
        "NBD_OPT_EXPORT_NAME for {name:?} failed ({reason}); that option cannot report errors"
    )]
    ExportNameRefused { name: String, reason: String },
    #[error("NBD_OPT_EXPORT_NAME before TLS on a listener that requires TLS")]
    TlsRequired,
    #[error("driver passed {got} bytes where {wanted} were wanted")]
    WrongInputLength { wanted: usize, got: usize },
    #[error("NBD_OPT_EXPORT_NAME after NBD_OPT_EXTENDED_HEADERS, which forbids it")]
    ExportNameWithExtendedHeaders,
}

/// What the driver does after [`Handshake::receive`]: send `reply` (possibly
/// empty) and then continue, enter transmission, or close.
pub enum Step {
    Continue {
        reply: Vec<u8>,
    },
    /// Send `reply` (the ACK of `NBD_OPT_STARTTLS`), then run the TLS
    /// handshake as the server and call [`Handshake::tls_established`];
    /// if it fails, close the connection.
    StartTls {
        reply: Vec<u8>,
    },
    Transmit {
        reply: Vec<u8>,
        session: Session,
    },
    Close {
        reply: Vec<u8>,
    },
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
    /// Replies may be chunks: structured replies or extended headers were
    /// negotiated.
    pub structured: bool,
    /// Extended headers were negotiated (`NBD_OPT_EXTENDED_HEADERS`):
    /// 32-byte request and reply headers, 64-bit lengths, no simple replies.
    pub extended: bool,
    /// The metadata contexts selected for this export (`base:allocation`
    /// and the export's own); block status is enabled when there is one.
    pub contexts: Arc<Vec<MetaContext>>,
    /// The client never learned our block sizes (it opened the export with
    /// `NBD_OPT_EXPORT_NAME`, or with `NBD_OPT_GO` without asking for
    /// `NBD_INFO_BLOCK_SIZE`), so, as the spec asks of a server, requests
    /// at any byte offset and length are served.
    pub byte_granular: bool,
    /// The smallest block requests address (the export's, advertised).
    pub min_block: u32,
}

impl Session {
    /// How the transmission phase frames requests and replies.
    pub fn framing(&self) -> Framing {
        Framing::new(self.structured, self.extended)
    }

    /// Whether `base:allocation` was selected.
    pub fn base_allocation(&self) -> bool {
        self.contexts.iter().any(|c| c.name == BASE_ALLOCATION)
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("export_name", &self.export_name)
            .field("size", &self.size)
            .field("read_only", &self.read_only)
            .field("transmission_flags", &self.transmission_flags)
            .field("structured", &self.structured)
            .field("extended", &self.extended)
            .field("contexts", &self.contexts)
            .finish_non_exhaustive()
    }
}

/// Transmission flags for an export, advertised truthfully: write-type
/// commands only for writable exports, `DF` only with structured replies or
/// extended headers (`structured`). Never `NBD_FLAG_BLOCK_STATUS_PAYLOAD`:
/// the payload form of block status is not implemented.
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

/// A listener's TLS mode (the spec's NOTLS, SELECTIVETLS, FORCEDTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused by policy.
    Off,
    /// TLS when the client asks for it; exports granted only to
    /// certificate holders answer plaintext clients `NBD_REP_ERR_TLS_REQD`.
    On,
    /// Every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` is refused
    /// until TLS is active, and `NBD_OPT_EXPORT_NAME` before TLS ends the
    /// connection.
    Require,
}

/// Why an export could not be opened, as the client is told.
enum Refusal {
    /// Hidden, missing or failed: `NBD_REP_ERR_UNKNOWN` (a hidden export
    /// looks exactly like a missing one).
    Export(ExportError),
    /// Granted only to clients with a certificate, and this one has not
    /// started TLS: `NBD_REP_ERR_TLS_REQD`.
    TlsRequired,
    /// The client may list the export but not open it: `NBD_REP_ERR_POLICY`.
    ListOnly,
}

impl Refusal {
    fn reply_type(&self) -> u32 {
        match self {
            Self::Export(_) => option_reply::ERR_UNKNOWN,
            Self::TlsRequired => option_reply::ERR_TLS_REQD,
            Self::ListOnly => option_reply::ERR_POLICY,
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Export(error) => error.to_string(),
            Self::TlsRequired => "this export requires TLS: send NBD_OPT_STARTTLS".to_owned(),
            Self::ListOnly => "this client may list the export but not open it".to_owned(),
        }
    }
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
    client: Client,
    tls: TlsMode,
    access: Arc<AccessList>,
    no_zeroes: bool,
    structured: bool,
    extended: bool,
    /// The export for which the last `NBD_OPT_SET_META_CONTEXT` selected
    /// contexts, and those contexts; block status is enabled only if the
    /// client then opens this same export.
    contexts_for: Option<(String, Vec<MetaContext>)>,
}

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    /// A handshake without TLS that lets the client open every export.
    pub fn new() -> Self {
        Self::for_client(
            Client::anonymous(),
            TlsMode::Off,
            Arc::new(AccessList::unrestricted()),
        )
    }

    /// A handshake on a listener with TLS mode `tls` and grants `access`;
    /// `client` is what is known of the client before any TLS.
    pub fn for_client(client: Client, tls: TlsMode, access: Arc<AccessList>) -> Self {
        Self {
            expect: Expect::ClientFlags,
            client,
            tls,
            access,
            no_zeroes: false,
            structured: false,
            extended: false,
            contexts_for: None,
        }
    }

    /// The client, with its identity once TLS is established.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Records that the TLS handshake after [`Step::StartTls`] succeeded,
    /// with the identity of the client's certificate if it presented one.
    /// Everything negotiated before TLS is forgotten, as the spec requires:
    /// a man in the middle could have chosen it.
    pub fn tls_established(&mut self, identity: Option<String>) {
        self.client = Client {
            tls: true,
            identity,
        };
        self.structured = false;
        self.extended = false;
        self.contexts_for = None;
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
        let Some(flags) = ByteReader::new(input).u32() else {
            // Unreachable: `receive` checked the length.
            return Err(self.wrong_length(input));
        };
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
        if self.tls == TlsMode::Require
            && !self.client.tls
            && code != option::STARTTLS
            && code != option::ABORT
        {
            // FORCEDTLS: EXPORT_NAME cannot be answered with an error.
            if code == option::EXPORT_NAME {
                return Err(HandshakeError::TlsRequired);
            }
            replies.error(
                option_reply::ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            );
            return Ok(Step::Continue {
                reply: replies.into_bytes(),
            });
        }
        match code {
            option::EXPORT_NAME => return self.export_name(data, exports),
            option::STARTTLS => {
                if self.start_tls(data, &mut replies) {
                    return Ok(Step::StartTls {
                        reply: replies.into_bytes(),
                    });
                }
            }
            option::ABORT => {
                // The spec says to ignore any data sent with ABORT.
                replies.ack();
                return Ok(Step::Close {
                    reply: replies.into_bytes(),
                });
            }
            option::LIST => self.list(data, exports, &mut replies),
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
            option::EXTENDED_HEADERS => self.extended_headers(data, &mut replies),
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
        if self.extended {
            // The client promised not to, and this option cannot be refused
            // with a reply.
            return Err(HandshakeError::ExportNameWithExtendedHeaders);
        }
        let name = ByteReader::new(data).string(data.len());
        let opened = match name {
            Some(name) => self.open_session(name, exports),
            None => Err(Refusal::Export(ExportError::Invalid(
                "export name is not valid text".into(),
            ))),
        };
        let session = opened.map_err(|refusal| HandshakeError::ExportNameRefused {
            name: String::from_utf8_lossy(data).into_owned(),
            reason: refusal.message(),
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
            Ok(session) => Session {
                byte_granular: !request.wants(info::BLOCK_SIZE),
                ..session
            },
            Err(refusal) => {
                replies.error(refusal.reply_type(), &refusal.message());
                return None;
            }
        };
        let mut export_info = info::EXPORT.to_be_bytes().to_vec();
        export_info.extend_from_slice(&session.size.to_be_bytes());
        export_info.extend_from_slice(&session.transmission_flags.to_be_bytes());
        replies.push(option_reply::INFO, &export_info);
        // Always sent, requested or not: our minimum block size is not the
        // protocol default of 1, so the spec asks us to advertise it.
        replies.push(option_reply::INFO, &block_size_info(session.min_block));
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
        if !no_data(data, "NBD_OPT_STRUCTURED_REPLY", replies) {
            return;
        }
        if self.extended {
            // Extended headers take precedence; there is no way back.
            replies.error(
                option_reply::ERR_EXT_HEADER_REQD,
                "extended headers are already negotiated",
            );
            return;
        }
        self.structured = true;
        replies.ack();
    }

    /// `NBD_OPT_EXTENDED_HEADERS`: accepted whether or not structured
    /// replies came first, and again if repeated. Meta contexts selected
    /// before stay selected: `base:allocation` needs no more than 32 bits
    /// of status either way.
    fn extended_headers(&mut self, data: &[u8], replies: &mut Replies) {
        if !no_data(data, "NBD_OPT_EXTENDED_HEADERS", replies) {
            return;
        }
        self.extended = true;
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
        let export = match self.open_export(request.export, exports) {
            Ok((export, _)) => export,
            Err(refusal) => {
                replies.error(refusal.reply_type(), &refusal.message());
                return;
            }
        };
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
        let mut own: Vec<String> = if request.queries.is_empty() {
            export.meta_contexts("")
        } else {
            request
                .queries
                .iter()
                .filter(|query| !query.starts_with(BASE_NAMESPACE))
                .flat_map(|query| export.meta_contexts(query))
                .collect()
        };
        own.sort();
        own.dedup();
        for name in own.iter().filter(|n| n.len() <= MAX_STRING_LEN) {
            replies.push(option_reply::META_CONTEXT, &meta_context(0, name));
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
        self.contexts_for = None;
        if !self.structured && !self.extended {
            replies.error(
                option_reply::ERR_INVALID,
                "negotiate structured replies or extended headers before meta contexts",
            );
            return;
        }
        let Some(request) = MetaContextRequest::parse(data) else {
            replies.error(option_reply::ERR_INVALID, "malformed meta context request");
            return;
        };
        let export = match self.open_export(request.export, exports) {
            Ok((export, _)) => export,
            Err(refusal) => {
                replies.error(refusal.reply_type(), &refusal.message());
                return;
            }
        };
        // Unknown namespaces and leaves, and wildcards, are ignored as the
        // spec allows; each known name is selected once, up to a bound.
        let mut selected: Vec<MetaContext> = Vec::new();
        for query in &request.queries {
            let known = *query == BASE_ALLOCATION
                || (!query.starts_with(BASE_NAMESPACE)
                    && export.meta_contexts(query).iter().any(|n| n == query));
            if !known
                || selected.iter().any(|c| c.name == *query)
                || selected.len() == MAX_META_CONTEXTS
            {
                continue;
            }
            let id = if *query == BASE_ALLOCATION {
                BASE_ALLOCATION_ID
            } else {
                // Ids after base:allocation's, unique in this selection.
                BASE_ALLOCATION_ID + 1 + selected.len() as u32
            };
            replies.push(option_reply::META_CONTEXT, &meta_context(id, query));
            selected.push(MetaContext {
                id,
                name: (*query).to_owned(),
            });
        }
        if !selected.is_empty() {
            self.contexts_for = Some((request.export.to_owned(), selected));
        }
        replies.ack();
    }

    /// Answers `NBD_OPT_STARTTLS`; true if TLS is to start.
    fn start_tls(&mut self, data: &[u8], replies: &mut Replies) -> bool {
        if self.tls == TlsMode::Off {
            replies.error(
                option_reply::ERR_POLICY,
                "TLS is not enabled on this listener",
            );
        } else if self.client.tls {
            replies.error(option_reply::ERR_INVALID, "TLS is already active");
        } else if no_data(data, "NBD_OPT_STARTTLS", replies) {
            replies.ack();
            return true;
        }
        false
    }

    /// Opens `name` if this client is granted it: the one place where the
    /// access list is applied to opening.
    fn open_export(
        &self,
        name: &str,
        exports: &dyn ExportProvider,
    ) -> Result<(Arc<dyn Export>, Access), Refusal> {
        let access = match self.access.access(&self.client, name) {
            Some(Access::List) => return Err(Refusal::ListOnly),
            Some(access) => access,
            None if self.tls == TlsMode::On
                && !self.client.tls
                && self.access.granted_with_certificate(name) =>
            {
                return Err(Refusal::TlsRequired)
            }
            None => return Err(Refusal::Export(ExportError::NotFound)),
        };
        let export = exports.open(name).map_err(Refusal::Export)?;
        Ok((export, access))
    }

    /// Lists the exports this client may see.
    fn list(&self, data: &[u8], exports: &dyn ExportProvider, replies: &mut Replies) {
        if !no_data(data, "NBD_OPT_LIST", replies) {
            return;
        }
        for listing in exports.list() {
            if self.access.access(&self.client, &listing.name).is_none() {
                continue;
            }
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

    fn open_session(&self, name: &str, exports: &dyn ExportProvider) -> Result<Session, Refusal> {
        let (export, access) = self.open_export(name, exports)?;
        // A client granted only reads gets a read-only session, whatever
        // the export allows.
        let read_only = export.read_only() || access < Access::Write;
        // The export's minimum block: a power of two the spec allows (64
        // KiB at most), else ours.
        let min_block = match export.min_block_size() {
            b if b.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_MIN_BLOCK).contains(&b) => b,
            _ => MIN_BLOCK_SIZE,
        };
        // Only whole minimum blocks are addressable, so the tail of an
        // unaligned export is not advertised.
        let size = export.size();
        let size = size - size % u64::from(min_block);
        Ok(Session {
            export_name: name.to_owned(),
            export,
            size,
            read_only,
            transmission_flags: transmission_flags(read_only, self.structured || self.extended),
            structured: self.structured || self.extended,
            extended: self.extended,
            contexts: Arc::new(match &self.contexts_for {
                Some((export, contexts)) if export == name => contexts.clone(),
                _ => Vec::new(),
            }),
            // Until the option that opens it says otherwise.
            byte_granular: true,
            min_block,
        })
    }
}

/// Whether an option that takes no data came without any; if not, it is
/// refused with `NBD_REP_ERR_INVALID`.
fn no_data(data: &[u8], option: &str, replies: &mut Replies) -> bool {
    if !data.is_empty() {
        replies.error(
            option_reply::ERR_INVALID,
            &format!("{option} takes no data"),
        );
    }
    data.is_empty()
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

/// The largest minimum block size the spec allows.
const MAX_MIN_BLOCK: u32 = 64 * 1024;

/// `NBD_INFO_BLOCK_SIZE` for an export whose minimum block is `min_block`
/// (a power of two from 512 to 64 KiB): the preferred block is at least it.
fn block_size_info(min_block: u32) -> Vec<u8> {
    let mut out = info::BLOCK_SIZE.to_be_bytes().to_vec();
    for size in [min_block, PREFERRED_BLOCK_SIZE.max(min_block), MAX_PAYLOAD] {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::memory::{ExportTable, MemoryExport};

    fn exports() -> ExportTable {
        let table = ExportTable::new();
        table.insert(
            "vol",
            Arc::new(MemoryExport::new(1 << 20).with_description("a volume")),
        );
        table.insert("snap", Arc::new(MemoryExport::new(1000).read_only()));
        table
    }

    /// How feeding a byte stream to a handshake ended.
    enum Outcome {
        NeedMore,
        Transmit(Session),
        Closed,
        Failed(HandshakeError),
    }

    /// Feeds `input` the way a driver would; returns the replies sent.
    fn drive(input: &[u8], exports: &ExportTable) -> (Vec<u8>, Outcome) {
        drive_with(Handshake::new(), input, exports, None)
    }

    /// As [`drive`], from `handshake`; a STARTTLS that is acknowledged
    /// succeeds at once, the client presenting a certificate of `identity`.
    fn drive_with(
        mut handshake: Handshake,
        input: &[u8],
        exports: &ExportTable,
        identity: Option<&str>,
    ) -> (Vec<u8>, Outcome) {
        let mut replies = Vec::new();
        let mut rest = input;
        loop {
            let wanted = handshake.wanted();
            if rest.len() < wanted {
                return (replies, Outcome::NeedMore);
            }
            let (chunk, tail) = rest.split_at(wanted);
            rest = tail;
            match handshake.receive(chunk, exports) {
                Ok(Step::Continue { reply }) => replies.extend(reply),
                Ok(Step::StartTls { reply }) => {
                    replies.extend(reply);
                    handshake.tls_established(identity.map(str::to_owned));
                }
                Ok(Step::Transmit { reply, session }) => {
                    replies.extend(reply);
                    return (replies, Outcome::Transmit(session));
                }
                Ok(Step::Close { reply }) => {
                    replies.extend(reply);
                    return (replies, Outcome::Closed);
                }
                Err(error) => return (replies, Outcome::Failed(error)),
            }
        }
    }

    fn client_flags(flags: u32) -> Vec<u8> {
        flags.to_be_bytes().to_vec()
    }

    fn option(code: u32, data: &[u8]) -> Vec<u8> {
        let mut out = IHAVEOPT.to_be_bytes().to_vec();
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    fn prefixed(text: &str) -> Vec<u8> {
        let mut out = (text.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn info_request(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut out = prefixed(name);
        out.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for request in requests {
            out.extend_from_slice(&request.to_be_bytes());
        }
        out
    }

    fn meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
        let mut out = prefixed(export);
        out.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for query in queries {
            out.extend(prefixed(query));
        }
        out
    }

    /// Splits option replies into (option, type, data).
    fn parse_replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut replies = Vec::new();
        while !bytes.is_empty() {
            let mut reader = ByteReader::new(bytes);
            assert_eq!(reader.u64(), Some(OPTION_REPLY_MAGIC));
            let (code, kind, len) = (
                reader.u32().unwrap(),
                reader.u32().unwrap(),
                reader.u32().unwrap(),
            );
            let data = reader.bytes(len as usize).unwrap().to_vec();
            replies.push((code, kind, data));
            bytes = &bytes[20 + len as usize..];
        }
        replies
    }

    fn session_after(input: Vec<u8>) -> (Vec<(u32, u32, Vec<u8>)>, Session) {
        match drive(&input, &exports()) {
            (replies, Outcome::Transmit(session)) => (parse_replies(&replies), session),
            (_, _) => panic!("handshake did not reach transmission"),
        }
    }

    #[test]
    fn greeting_offers_fixed_newstyle_and_no_zeroes() {
        let greeting = greeting();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(&greeting[16..], &[0, 3]);
    }

    #[test]
    fn unknown_client_flags_end_the_handshake() {
        let (replies, outcome) = drive(&client_flags(4), &exports());
        assert!(replies.is_empty());
        assert!(matches!(
            outcome,
            Outcome::Failed(HandshakeError::UnknownClientFlags(4))
        ));
    }

    #[test]
    fn go_reports_size_flags_and_block_sizes_then_transmits() {
        let mut input = client_flags(3);
        input.extend(option(
            option::GO,
            &info_request("vol", &[info::NAME, info::DESCRIPTION]),
        ));
        let (replies, session) = session_after(input);
        let types: Vec<u32> = replies.iter().map(|r| r.1).collect();
        assert_eq!(types, [3, 3, 3, 3, option_reply::ACK]);
        let export_info = &replies[0].2;
        assert_eq!(export_info[..2], info::EXPORT.to_be_bytes());
        assert_eq!(export_info[2..10], (1u64 << 20).to_be_bytes());
        assert_eq!(
            export_info[10..12],
            session.transmission_flags.to_be_bytes()
        );
        assert_eq!(
            replies[1].2[2..],
            [0, 0, 2, 0, 0, 0, 0x10, 0, 0x02, 0, 0, 0][..],
            "block sizes 512 / 4096 / 32 MiB"
        );
        assert_eq!(replies[2].2[2..], *b"vol");
        assert_eq!(replies[3].2[2..], *b"a volume");
        assert!(!session.structured && !session.base_allocation() && !session.read_only);
    }

    /// An export with a larger minimum block (a volume encrypted in 4 KiB
    /// units) advertises it, and its preferred block is at least it; its
    /// size is whole minimum blocks. One that asks for a size the spec
    /// does not allow gets ours.
    #[test]
    fn an_exports_own_minimum_block_is_advertised() {
        let table = ExportTable::new();
        table.insert(
            "units",
            Arc::new(MemoryExport::new((1 << 20) + 512).with_min_block(4096)),
        );
        table.insert(
            "odd",
            Arc::new(MemoryExport::new(8192).with_min_block(3000)),
        );
        let session_after = |input: Vec<u8>| match drive(&input, &table) {
            (replies, Outcome::Transmit(session)) => (parse_replies(&replies), session),
            (_, _) => panic!("handshake did not reach transmission"),
        };
        let mut input = client_flags(3);
        input.extend(option(
            option::GO,
            &info_request("units", &[info::BLOCK_SIZE]),
        ));
        let (replies, session) = session_after(input);
        assert_eq!(
            replies[1].2[2..],
            [0, 0, 0x10, 0, 0, 0, 0x10, 0, 0x02, 0, 0, 0][..],
            "block sizes 4096 / 4096 / 32 MiB"
        );
        assert_eq!((session.min_block, session.size), (4096, 1 << 20));
        let mut input = client_flags(3);
        input.extend(option(option::GO, &info_request("odd", &[])));
        let (replies, session) = session_after(input);
        assert_eq!(replies[1].2[2..6], [0, 0, 2, 0]);
        assert_eq!(session.min_block, 512);
    }

    #[test]
    fn info_then_go_for_a_missing_export_is_an_error_reply() {
        let mut input = client_flags(1);
        input.extend(option(option::INFO, &info_request("nope", &[])));
        input.extend(option(option::GO, &info_request("snap", &[])));
        let (replies, session) = session_after(input);
        assert_eq!(replies[0].1, option_reply::ERR_UNKNOWN);
        assert!(session.read_only);
        // The unaligned 1000-byte export is advertised as its whole sectors.
        assert_eq!(session.size, 512);
    }

    #[test]
    fn block_status_needs_a_context_selected_for_the_same_export() {
        let mut input = client_flags(3);
        input.extend(option(option::STRUCTURED_REPLY, &[]));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &["base:", "qemu:dirty-bitmap:x", BASE_ALLOCATION]),
        ));
        let mut same = input.clone();
        same.extend(option(option::GO, &info_request("vol", &[])));
        let (replies, session) = session_after(same);
        assert_eq!(replies[0].1, option_reply::ACK);
        assert_eq!(replies[1].1, option_reply::META_CONTEXT);
        assert_eq!(
            replies[1].2,
            meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION)
        );
        assert!(session.structured && session.base_allocation());
        assert_ne!(session.transmission_flags & transmission_flags::SEND_DF, 0);

        input.extend(option(option::GO, &info_request("snap", &[])));
        let (_, session) = session_after(input);
        assert!(!session.base_allocation());
    }

    /// The reply types of a handshake's replies, and the session it opened.
    fn reply_types_and_session(input: Vec<u8>) -> (Vec<u32>, Session) {
        let (replies, session) = session_after(input);
        (replies.iter().map(|r| r.1).collect(), session)
    }

    #[test]
    fn extended_headers_imply_structured_replies_and_keep_meta_contexts() {
        use option_reply::{ACK, ERR_EXT_HEADER_REQD, INFO, META_CONTEXT};
        // Alone, before GO.
        let mut input = client_flags(3);
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(
            option::GO,
            &info_request("vol", &[info::BLOCK_SIZE]),
        ));
        let (types, session) = reply_types_and_session(input);
        assert_eq!(types, [ACK, INFO, INFO, ACK]);
        assert!(session.extended && session.structured && !session.base_allocation());
        assert_eq!(session.framing(), Framing::Extended);
        assert_ne!(session.transmission_flags & transmission_flags::SEND_DF, 0);
        assert_eq!(
            session.transmission_flags & (1 << 12),
            0,
            "NBD_FLAG_BLOCK_STATUS_PAYLOAD is not offered"
        );

        // After structured replies and meta contexts: extended headers take
        // precedence and the contexts stay selected.
        let mut input = client_flags(3);
        input.extend(option(option::STRUCTURED_REPLY, &[]));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &[BASE_ALLOCATION]),
        ));
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(option::GO, &info_request("vol", &[])));
        let (types, session) = reply_types_and_session(input);
        assert_eq!(types, [ACK, META_CONTEXT, ACK, ACK, INFO, INFO, ACK]);
        assert_eq!(session.framing(), Framing::Extended);
        assert!(session.base_allocation());

        // Meta contexts need no structured replies once extended headers
        // are negotiated; structured replies can no longer be asked for;
        // asking again for extended headers is harmless.
        let mut input = client_flags(3);
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(option::STRUCTURED_REPLY, &[]));
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &[BASE_ALLOCATION]),
        ));
        input.extend(option(option::GO, &info_request("vol", &[])));
        let (types, session) = reply_types_and_session(input);
        assert_eq!(
            types,
            [
                ACK,
                ERR_EXT_HEADER_REQD,
                ACK,
                META_CONTEXT,
                ACK,
                INFO,
                INFO,
                ACK
            ]
        );
        assert_eq!(session.framing(), Framing::Extended);
        assert!(session.base_allocation());
    }

    #[test]
    fn extended_headers_with_data_are_refused_and_not_negotiated() {
        let mut input = client_flags(3);
        input.extend(option(option::EXTENDED_HEADERS, b"x"));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &[BASE_ALLOCATION]),
        ));
        input.extend(option(option::GO, &info_request("vol", &[])));
        let (types, session) = reply_types_and_session(input);
        use option_reply::{ACK, ERR_INVALID, INFO};
        assert_eq!(types, [ERR_INVALID, ERR_INVALID, INFO, INFO, ACK]);
        assert_eq!(session.framing(), Framing::Simple);
    }

    #[test]
    fn export_name_after_extended_headers_ends_the_handshake() {
        let mut input = client_flags(3);
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(option::EXPORT_NAME, b"vol"));
        let (replies, outcome) = drive(&input, &exports());
        assert_eq!(
            parse_replies(&replies),
            [(option::EXTENDED_HEADERS, option_reply::ACK, vec![])]
        );
        assert!(matches!(
            outcome,
            Outcome::Failed(HandshakeError::ExportNameWithExtendedHeaders)
        ));
    }

    #[test]
    fn meta_context_listing_and_wildcards() {
        let mut input = client_flags(3);
        input.extend(option(option::LIST_META_CONTEXT, &meta_request("vol", &[])));
        input.extend(option(
            option::LIST_META_CONTEXT,
            &meta_request("vol", &["base:"]),
        ));
        input.extend(option(
            option::LIST_META_CONTEXT,
            &meta_request("vol", &["other:x"]),
        ));
        input.extend(option(option::STRUCTURED_REPLY, &[]));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &["base:"]),
        ));
        input.extend(option(
            option::LIST_META_CONTEXT,
            &meta_request("gone", &[]),
        ));
        let (replies, outcome) = drive(&input, &exports());
        assert!(matches!(outcome, Outcome::NeedMore));
        let types: Vec<u32> = parse_replies(&replies).iter().map(|r| r.1).collect();
        use option_reply::{ACK, ERR_UNKNOWN, META_CONTEXT};
        assert_eq!(
            types,
            [
                META_CONTEXT,
                ACK,
                META_CONTEXT,
                ACK,
                ACK,
                ACK,
                ACK,
                ERR_UNKNOWN
            ]
        );
    }

    #[test]
    fn list_names_every_export_with_its_description() {
        let mut input = client_flags(3);
        input.extend(option(option::LIST, &[]));
        let (replies, _) = drive(&input, &exports());
        let replies = parse_replies(&replies);
        let mut expected_vol = prefixed("vol");
        expected_vol.extend_from_slice(b"a volume");
        assert_eq!(replies[0].2, prefixed("snap"));
        assert_eq!(replies[1].2, expected_vol);
        assert_eq!(replies[2].1, option_reply::ACK);
    }

    #[test]
    fn export_name_pads_unless_no_zeroes() {
        for (flags, len) in [(1, 10 + EXPORT_NAME_PADDING), (3, 10)] {
            let mut input = client_flags(flags);
            input.extend(option(option::EXPORT_NAME, b"vol"));
            let (reply, outcome) = drive(&input, &exports());
            assert!(matches!(outcome, Outcome::Transmit(_)));
            assert_eq!(reply.len(), len);
        }
        let mut input = client_flags(3);
        input.extend(option(option::EXPORT_NAME, b"missing"));
        assert!(matches!(
            drive(&input, &exports()).1,
            Outcome::Failed(HandshakeError::ExportNameRefused { .. })
        ));
    }

    #[test]
    fn abort_acknowledges_and_closes() {
        let mut input = client_flags(3);
        input.extend(option(option::ABORT, b"ignored"));
        let (replies, outcome) = drive(&input, &exports());
        assert!(matches!(outcome, Outcome::Closed));
        assert_eq!(
            parse_replies(&replies),
            [(option::ABORT, option_reply::ACK, vec![])]
        );
    }

    #[test]
    fn oversized_options_and_bad_magic_are_fatal() {
        let mut input = client_flags(3);
        input.extend(IHAVEOPT.to_be_bytes());
        input.extend(option::GO.to_be_bytes());
        input.extend((MAX_OPTION_LEN + 1).to_be_bytes());
        assert!(matches!(
            drive(&input, &exports()).1,
            Outcome::Failed(HandshakeError::OptionTooLong { .. })
        ));
        let mut input = client_flags(3);
        input.extend([0u8; OPTION_HEADER_LEN]);
        assert!(matches!(
            drive(&input, &exports()).1,
            Outcome::Failed(HandshakeError::BadOptionMagic(0))
        ));
    }

    #[test]
    fn receive_rejects_input_of_the_wrong_length() {
        let mut handshake = Handshake::new();
        assert!(matches!(
            handshake.receive(&[0; 3], &exports()),
            Err(HandshakeError::WrongInputLength { wanted: 4, got: 3 })
        ));
    }

    #[test]
    fn transmission_flags_are_truthful() {
        use transmission_flags::*;
        let writable = transmission_flags(false, false);
        assert_eq!(writable & (READ_ONLY | SEND_DF), 0);
        let writes = SEND_TRIM | SEND_WRITE_ZEROES | SEND_FAST_ZERO | SEND_FUA;
        assert_eq!(writable & writes, writes);
        let read_only = transmission_flags(true, true);
        assert_eq!(read_only & writes, 0);
        assert_ne!(read_only & READ_ONLY, 0);
        assert_ne!(read_only & SEND_DF, 0);
    }

    fn secured(mode: TlsMode, rules: Vec<crate::access::Rule>) -> Handshake {
        Handshake::for_client(Client::anonymous(), mode, Arc::new(AccessList::new(rules)))
    }

    fn grant(
        principal: crate::access::Principal,
        exports: &[&str],
        access: Access,
    ) -> crate::access::Rule {
        crate::access::Rule {
            principal,
            exports: exports
                .iter()
                .map(|e| crate::access::Pattern::new(*e))
                .collect(),
            access,
        }
    }

    fn kinds(replies: &[(u32, u32, Vec<u8>)]) -> Vec<(u32, u32)> {
        replies
            .iter()
            .map(|(code, kind, _)| (*code, *kind))
            .collect()
    }

    #[test]
    fn starttls_is_refused_by_policy_without_tls() {
        let mut input = client_flags(3);
        input.extend(option(option::STARTTLS, &[]));
        let (replies, outcome) = drive(&input, &exports());
        assert!(matches!(outcome, Outcome::NeedMore));
        assert_eq!(
            kinds(&parse_replies(&replies)),
            [(option::STARTTLS, option_reply::ERR_POLICY)]
        );
    }

    #[test]
    fn forced_tls_refuses_every_option_but_starttls_and_abort_until_tls() {
        let everyone = vec![grant(
            crate::access::Principal::Anonymous,
            &["*"],
            Access::Write,
        )];
        let mut input = client_flags(3);
        for code in [
            option::LIST,
            option::INFO,
            option::GO,
            option::STRUCTURED_REPLY,
            option::LIST_META_CONTEXT,
            option::SET_META_CONTEXT,
            11,
            99,
        ] {
            input.extend(option(code, &info_request("vol", &[])));
        }
        let (replies, outcome) = drive_with(
            secured(TlsMode::Require, everyone.clone()),
            &input,
            &exports(),
            None,
        );
        assert!(matches!(outcome, Outcome::NeedMore));
        let replies = parse_replies(&replies);
        assert_eq!(replies.len(), 8);
        assert!(replies
            .iter()
            .all(|(_, kind, _)| *kind == option_reply::ERR_TLS_REQD));

        // EXPORT_NAME cannot be refused with a reply: the session ends.
        let mut input = client_flags(3);
        input.extend(option(option::EXPORT_NAME, b"vol"));
        let (replies, outcome) = drive_with(
            secured(TlsMode::Require, everyone.clone()),
            &input,
            &exports(),
            None,
        );
        assert!(replies.is_empty());
        assert!(matches!(
            outcome,
            Outcome::Failed(HandshakeError::TlsRequired)
        ));

        // ABORT is still answered.
        let mut input = client_flags(3);
        input.extend(option(option::ABORT, &[]));
        let (replies, outcome) = drive_with(
            secured(TlsMode::Require, everyone.clone()),
            &input,
            &exports(),
            None,
        );
        assert!(matches!(outcome, Outcome::Closed));
        assert_eq!(
            kinds(&parse_replies(&replies)),
            [(option::ABORT, option_reply::ACK)]
        );

        // After STARTTLS everything works, a second STARTTLS is invalid,
        // and TLS_REQD is never sent again.
        let mut input = client_flags(3);
        input.extend(option(option::STARTTLS, &[]));
        input.extend(option(option::STARTTLS, &[]));
        input.extend(option(option::LIST, &[]));
        input.extend(option(option::GO, &info_request("vol", &[])));
        let (replies, outcome) = drive_with(
            secured(TlsMode::Require, everyone),
            &input,
            &exports(),
            None,
        );
        let Outcome::Transmit(session) = outcome else {
            panic!("no transmission after STARTTLS")
        };
        assert!(!session.read_only);
        let replies = parse_replies(&replies);
        assert_eq!(replies[0].1, option_reply::ACK);
        assert_eq!(replies[1].1, option_reply::ERR_INVALID);
        assert!(replies
            .iter()
            .all(|(_, kind, _)| *kind != option_reply::ERR_TLS_REQD));
    }

    #[test]
    fn starttls_forgets_what_was_negotiated_before() {
        let everyone = vec![grant(
            crate::access::Principal::Anonymous,
            &["*"],
            Access::Write,
        )];
        let mut input = client_flags(3);
        input.extend(option(option::STRUCTURED_REPLY, &[]));
        input.extend(option(option::EXTENDED_HEADERS, &[]));
        input.extend(option(
            option::SET_META_CONTEXT,
            &meta_request("vol", &[BASE_ALLOCATION]),
        ));
        input.extend(option(option::STARTTLS, b"x"));
        input.extend(option(option::STARTTLS, &[]));
        input.extend(option(option::GO, &info_request("vol", &[])));
        let (replies, outcome) =
            drive_with(secured(TlsMode::On, everyone), &input, &exports(), None);
        let Outcome::Transmit(session) = outcome else {
            panic!("no transmission")
        };
        let replies = parse_replies(&replies);
        // STARTTLS with data is invalid; the one without is acknowledged.
        assert!(
            replies
                .iter()
                .any(|(code, kind, _)| *code == option::STARTTLS
                    && *kind == option_reply::ERR_INVALID)
        );
        assert!(!session.structured && !session.extended);
        assert!(!session.base_allocation());
    }

    #[test]
    fn grants_decide_what_is_listed_opened_and_written() {
        use crate::access::Principal;
        let rules = vec![
            grant(Principal::Identity("ci".into()), &["vol"], Access::Write),
            grant(Principal::Identity("viewer".into()), &["vol"], Access::Read),
            grant(
                Principal::Identity("viewer".into()),
                &["snap"],
                Access::List,
            ),
            grant(Principal::Anonymous, &["snap"], Access::Read),
        ];
        let session_for = |identity: Option<&str>, name: &str| {
            let mut input = client_flags(3);
            input.extend(option(option::STARTTLS, &[]));
            input.extend(option(option::LIST, &[]));
            input.extend(option(option::GO, &info_request(name, &[])));
            let (replies, outcome) = drive_with(
                secured(TlsMode::Require, rules.clone()),
                &input,
                &exports(),
                identity,
            );
            let listed: Vec<String> = parse_replies(&replies)
                .into_iter()
                .filter(|(_, kind, _)| *kind == option_reply::SERVER)
                .map(|(_, _, data)| {
                    String::from_utf8_lossy(&data[4..4 + data[3] as usize]).into_owned()
                })
                .collect();
            let last = parse_replies(&replies).last().map(|r| r.1);
            (listed, outcome, last)
        };
        let (listed, outcome, _) = session_for(Some("ci"), "vol");
        assert_eq!(listed, ["vol"]);
        assert!(matches!(outcome, Outcome::Transmit(ref s) if !s.read_only));
        let (listed, outcome, _) = session_for(Some("viewer"), "vol");
        assert_eq!(listed.len(), 2);
        assert!(matches!(outcome, Outcome::Transmit(ref s) if s.read_only));
        // Listed but not openable: refused by policy.
        let (_, outcome, last) = session_for(Some("viewer"), "snap");
        assert!(matches!(outcome, Outcome::NeedMore));
        assert_eq!(last, Some(option_reply::ERR_POLICY));
        // Hidden exports look like missing ones.
        let (listed, outcome, last) = session_for(Some("ci"), "snap");
        assert_eq!(listed, ["vol"]);
        assert!(matches!(outcome, Outcome::NeedMore));
        assert_eq!(last, Some(option_reply::ERR_UNKNOWN));
        let (listed, _, last) = session_for(Some("stranger"), "vol");
        assert!(listed.is_empty());
        assert_eq!(last, Some(option_reply::ERR_UNKNOWN));
        // Anonymous over TLS: only what anonymous clients are granted.
        let (listed, outcome, _) = session_for(None, "snap");
        assert_eq!(listed, ["snap"]);
        assert!(matches!(outcome, Outcome::Transmit(ref s) if s.read_only));
    }

    #[test]
    fn selective_tls_tells_plaintext_clients_which_exports_need_tls() {
        use crate::access::Principal;
        let rules = vec![
            grant(Principal::Identity("ci".into()), &["vol"], Access::Write),
            grant(Principal::Anonymous, &["snap"], Access::Read),
        ];
        let mut input = client_flags(3);
        input.extend(option(option::LIST, &[]));
        input.extend(option(option::INFO, &info_request("vol", &[])));
        input.extend(option(option::INFO, &info_request("ghost", &[])));
        input.extend(option(option::GO, &info_request("snap", &[])));
        let (replies, outcome) = drive_with(
            secured(TlsMode::On, rules.clone()),
            &input,
            &exports(),
            None,
        );
        assert!(matches!(outcome, Outcome::Transmit(ref s) if s.read_only));
        let replies = kinds(&parse_replies(&replies));
        assert!(replies.contains(&(option::INFO, option_reply::ERR_TLS_REQD)));
        assert!(replies.contains(&(option::INFO, option_reply::ERR_UNKNOWN)));
        // Without TLS on the listener, TLS_REQD is never sent.
        let mut input = client_flags(3);
        input.extend(option(option::INFO, &info_request("vol", &[])));
        let (replies, _) = drive_with(
            secured(TlsMode::Off, rules.clone()),
            &input,
            &exports(),
            None,
        );
        assert_eq!(
            kinds(&parse_replies(&replies)),
            [(option::INFO, option_reply::ERR_UNKNOWN)]
        );
        // EXPORT_NAME for an export the client may not open ends the session.
        let mut input = client_flags(3);
        input.extend(option(option::EXPORT_NAME, b"vol"));
        let (_, outcome) = drive_with(secured(TlsMode::On, rules), &input, &exports(), None);
        assert!(matches!(
            outcome,
            Outcome::Failed(HandshakeError::ExportNameRefused { .. })
        ));
    }

    proptest! {
        #[test]
        fn forced_tls_answers_nothing_but_tls_reqd_before_tls(
            options in proptest::collection::vec(
                (0u32..16, proptest::collection::vec(any::<u8>(), 0..64)), 1..8),
        ) {
            let everyone = vec![grant(crate::access::Principal::Anonymous, &["*"], Access::Write)];
            let mut input = client_flags(3);
            for (code, data) in options.iter().filter(|(code, _)| *code != option::STARTTLS) {
                input.extend(option(*code, data));
            }
            let (replies, outcome) = drive_with(secured(TlsMode::Require, everyone), &input, &exports(), None);
            prop_assert!(!matches!(outcome, Outcome::Transmit(_)));
            for (code, kind, _) in parse_replies(&replies) {
                prop_assert!(
                    kind == option_reply::ERR_TLS_REQD || (code == option::ABORT && kind == option_reply::ACK),
                    "option {} got reply {:#x}", code, kind
                );
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..2048)) {
            drive(&input, &exports());
        }

        #[test]
        fn arbitrary_options_get_replies_or_end_cleanly(
            options in proptest::collection::vec(
                (0u32..16, proptest::collection::vec(any::<u8>(), 0..64)), 1..8),
        ) {
            let mut input = client_flags(3);
            for (code, data) in &options {
                input.extend(option(*code, data));
            }
            let (replies, outcome) = drive(&input, &exports());
            if let Outcome::NeedMore = outcome {
                // Every option was answered, ending with a final reply.
                let replies = parse_replies(&replies);
                let finals = replies
                    .iter()
                    .filter(|(_, kind, _)| *kind == option_reply::ACK || *kind & (1 << 31) != 0)
                    .count();
                prop_assert_eq!(finals, options.len());
            }
        }

        #[test]
        fn info_requests_round_trip(
            name in "[a-z0-9/_.-]{0,64}",
            requests in proptest::collection::vec(any::<u16>(), 0..16),
        ) {
            let encoded = info_request(&name, &requests);
            let parsed = InfoRequest::parse(&encoded).unwrap();
            prop_assert_eq!(parsed, InfoRequest { name: &name, requests: requests.clone() });
            // A truncated payload is never accepted.
            prop_assert!(InfoRequest::parse(&encoded[..encoded.len() - 1]).is_none());
        }

        #[test]
        fn meta_context_requests_round_trip(
            export in "[a-z0-9]{0,32}",
            queries in proptest::collection::vec("[a-z]{1,8}:[a-z]{0,16}", 0..8),
        ) {
            let query_refs: Vec<&str> = queries.iter().map(String::as_str).collect();
            let encoded = meta_request(&export, &query_refs);
            let parsed = MetaContextRequest::parse(&encoded).unwrap();
            prop_assert_eq!(parsed, MetaContextRequest { export: &export, queries: query_refs });
        }
    }
}
