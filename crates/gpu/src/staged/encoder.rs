//! The seam between the stager and the device codecs: an [`Encoder`] encodes a tensor where
//! it lives, into the payload the engine's own codec would write, so only the payload comes
//! to the host; and [`StagerStats`], what went to the host each way.

use gradwire_codec::{BuildContext, CodecConfig, Progress};

use super::{DevicePtr, StreamApi};
use crate::error::Result;

/// Encodes device tensors in place (on a GPU: [`super::device_codecs::DeviceCodecs`]).
pub trait Encoder<A: StreamApi>: Send {
    /// Whether tensor `name` of `len` elements is encoded here. `context` is the engine's
    /// codec configuration and build context for it (`Engine::codec_context`), `None` when
    /// the engine takes no payloads for it; an encoder builds its codec from it, so that its
    /// payloads are the engine's codec's. Asked once per name.
    fn accepts(
        &mut self,
        name: &str,
        len: usize,
        context: Option<(CodecConfig, BuildContext)>,
    ) -> bool;

    /// Encodes the `len` floats at `src` into `out` at training position `progress`, once
    /// `ready` (recorded on the producer's stream) has completed on the device.
    ///
    /// # Safety
    /// `src` must address `len` floats on the device that stay allocated and unwritten until
    /// this returns.
    unsafe fn encode(
        &mut self,
        name: &str,
        src: DevicePtr,
        len: usize,
        ready: &A::Event,
        progress: Progress,
        out: &mut Vec<u8>,
    ) -> Result<()>;
}

/// What the stager moved to the host, by path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagerStats {
    /// Tensors copied down whole (host-transfer path).
    pub staged: u64,
    /// Their bytes, copied device → host.
    pub staged_bytes: u64,
    /// Tensors encoded on the device.
    pub encoded: u64,
    /// Their dense bytes (which stayed on the device).
    pub encoded_bytes: u64,
    /// Their payloads' bytes, the only part copied to the host.
    pub payload_bytes: u64,
}
