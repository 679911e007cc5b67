//! Runs a validated [`Command`] against an [`Export`] and builds the complete
//! reply. Synchronous (the export blocks); the server calls it from
//! `spawn_blocking`. No sockets here, so it is tested directly.

use bytes::Bytes;

use crate::export::{Export, ExportError};
use crate::proto::{Errno, BASE_ALLOCATION_ID};
use crate::transmission::{
    block_status_chunk, error_chunk, extents_from_runs, none_chunk, offset_data_header,
    offset_hole_chunk, plan_read, simple_reply, Command, ReadSegment,
};

/// Largest range one block status request asks the export about, bounding
/// the export's work and the run list it returns; clients ask again for the
/// rest.
pub const MAX_STATUS_QUERY: u32 = 1 << 30;

/// A complete reply: byte strings to send back to back, never interleaved
/// with another reply.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reply {
    pub parts: Vec<Bytes>,
}

impl Reply {
    fn single(bytes: impl Into<Bytes>) -> Self {
        Self {
            parts: vec![bytes.into()],
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How replies are framed on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyContext {
    pub cookie: u64,
    pub structured: bool,
}

impl ReplyContext {
    /// Success without data.
    pub fn ok(self) -> Reply {
        Reply::single(simple_reply(self.cookie, None).to_vec())
    }

    /// Failure: a structured error chunk (which can carry the message) when
    /// negotiated, else a simple reply with just the error value.
    pub fn error(self, errno: Errno, message: &str) -> Reply {
        if self.structured {
            Reply::single(error_chunk(self.cookie, errno, message))
        } else {
            Reply::single(simple_reply(self.cookie, Some(errno)).to_vec())
        }
    }

    fn export_error(self, error: &ExportError) -> Reply {
        self.error(error.errno(), &error.to_string())
    }

    fn result(self, result: Result<(), ExportError>) -> Reply {
        match result {
            Ok(()) => self.ok(),
            Err(error) => self.export_error(&error),
        }
    }
}

/// Executes `command`; `payload` is the data of a write (empty otherwise).
pub fn execute(
    export: &dyn Export,
    context: ReplyContext,
    command: Command,
    payload: &[u8],
) -> Reply {
    let fua_flush = |fua: bool| if fua { export.flush() } else { Ok(()) };
    let result = match command {
        Command::Read {
            offset,
            length,
            dont_fragment,
        } => return read(export, context, offset, length, dont_fragment),
        Command::BlockStatus {
            offset,
            length,
            req_one,
        } => return block_status(export, context, offset, length, req_one),
        // Zero-length ranges are legal but pointless: succeed without
        // bothering the export.
        Command::Write { length: 0, .. }
        | Command::Trim { length: 0, .. }
        | Command::WriteZeroes { length: 0, .. }
        | Command::Cache { length: 0, .. } => Ok(()),
        Command::Write { offset, fua, .. } => {
            export.write(offset, payload).and_then(|()| fua_flush(fua))
        }
        Command::Flush => export.flush(),
        Command::Trim {
            offset,
            length,
            fua,
        } => export
            .trim(offset, length.into())
            .and_then(|()| fua_flush(fua)),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim,
            fast_only,
        } => export
            .write_zeroes(offset, length.into(), may_trim, fast_only)
            .and_then(|()| fua_flush(fua)),
        Command::Cache { offset, length } => export.cache(offset, length.into()),
        // The connection handles disconnects itself; nothing to reply.
        Command::Disconnect => return Reply::default(),
    };
    context.result(result)
}

fn read(
    export: &dyn Export,
    context: ReplyContext,
    offset: u64,
    length: u32,
    dont_fragment: bool,
) -> Reply {
    if !context.structured {
        return simple_read(export, context, offset, length);
    }
    let segments = if dont_fragment || length == 0 {
        // One content chunk: holes are sent as explicit zeroes.
        plan_read(offset, length, &[])
    } else {
        match export.block_status(offset, length.into()) {
            Ok(runs) => plan_read(offset, length, &runs),
            Err(error) => return context.export_error(&error),
        }
    };
    match structured_read(export, context.cookie, &segments) {
        Ok(reply) => reply,
        Err(error) => context.export_error(&error),
    }
}

fn simple_read(export: &dyn Export, context: ReplyContext, offset: u64, length: u32) -> Reply {
    // `length <= MAX_PAYLOAD` (validated), so this allocation is bounded.
    let mut data = vec![0u8; length as usize];
    if let Err(error) = export.read(offset, &mut data) {
        return context.export_error(&error);
    }
    Reply {
        parts: vec![
            Bytes::copy_from_slice(&simple_reply(context.cookie, None)),
            Bytes::from(data),
        ],
    }
}

/// Reads every data segment into one buffer, then frames the segments as
/// content chunks, the last one flagged done. Everything is read before
/// anything is framed, so an error can still be reported as a single error
/// chunk.
fn structured_read(
    export: &dyn Export,
    cookie: u64,
    segments: &[ReadSegment],
) -> Result<Reply, ExportError> {
    let data_len: usize = segments
        .iter()
        .map(|segment| match segment {
            ReadSegment::Data { length, .. } => *length as usize,
            ReadSegment::Hole { .. } => 0,
        })
        .sum();
    let mut data = vec![0u8; data_len];
    let mut filled = 0usize;
    for segment in segments {
        if let ReadSegment::Data { offset, length } = *segment {
            let end = filled + length as usize;
            // In bounds: the segment lengths sum to `data_len`.
            export.read(offset, &mut data[filled..end])?;
            filled = end;
        }
    }
    let data = Bytes::from(data);
    let Some(last) = segments.len().checked_sub(1) else {
        return Ok(Reply::single(none_chunk(cookie).to_vec()));
    };
    let mut parts = Vec::with_capacity(2 * segments.len());
    let mut consumed = 0usize;
    for (index, segment) in segments.iter().enumerate() {
        let done = index == last;
        match *segment {
            ReadSegment::Data { offset, length } => {
                parts.push(Bytes::from(offset_data_header(
                    cookie, offset, length, done,
                )));
                let end = consumed + length as usize;
                parts.push(data.slice(consumed..end));
                consumed = end;
            }
            ReadSegment::Hole { offset, length } => {
                parts.push(Bytes::from(offset_hole_chunk(cookie, offset, length, done)));
            }
        }
    }
    Ok(Reply { parts })
}

fn block_status(
    export: &dyn Export,
    context: ReplyContext,
    offset: u64,
    length: u32,
    req_one: bool,
) -> Reply {
    let query = length.min(MAX_STATUS_QUERY);
    let runs = match export.block_status(offset, query.into()) {
        Ok(runs) => runs,
        Err(error) => return context.export_error(&error),
    };
    let extents = extents_from_runs(&runs, query, req_one);
    if extents.is_empty() {
        return context.error(Errno::Io, "export reported no allocation status");
    }
    Reply::single(block_status_chunk(
        context.cookie,
        BASE_ALLOCATION_ID,
        &extents,
    ))
}
