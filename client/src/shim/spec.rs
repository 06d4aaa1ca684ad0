//! The shim's one input: a [`ShimSpec`] that the daemon writes to its stdin
//! as one codec frame (a big-endian `u32` length, then the postcard body)
//! before closing it.

use std::io::Read;

use tether_protocol::codec::decode_message;
use tether_protocol::{ShimSpec, DEFAULT_MAX_FRAME_LEN};

use crate::error::{Error, Result};

/// Reads and decodes the spec. A missing, cut-short, oversized or
/// malformed frame is an [`Error::Usage`] that says what arrived, since
/// the usual cause is starting the shim by hand.
pub fn read(mut input: impl Read) -> Result<ShimSpec> {
    let mut prefix = [0u8; 4];
    read_exact(&mut input, &mut prefix, "the length prefix")?;
    let len = u32::from_be_bytes(prefix) as usize;
    if len > DEFAULT_MAX_FRAME_LEN {
        return Err(Error::Usage(format!(
            "the spec on stdin announces {len} bytes, more than the maximum of \
             {DEFAULT_MAX_FRAME_LEN}; tether-shim is started by tetherd, which writes it"
        )));
    }
    let mut body = vec![0u8; len];
    read_exact(&mut input, &mut body, "the spec")?;
    let spec: ShimSpec = decode_message(&body)
        .map_err(|e| Error::Usage(format!("the spec on stdin is not a valid ShimSpec: {e}")))?;
    Ok(spec)
}

fn read_exact(input: &mut impl Read, into: &mut [u8], what: &str) -> Result<()> {
    input.read_exact(into).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Usage(format!(
                "stdin ended before {what} of a ShimSpec frame; \
                 tether-shim is started by tetherd, which writes one there"
            ))
        } else {
            Error::Local {
                context: "cannot read the spec from stdin".into(),
                source: e,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::codec::encode_frame;

    fn spec() -> ShimSpec {
        ShimSpec {
            execution: "job-abcdef".into(),
            attempt: 2,
            socket: "/run/t.sock".into(),
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            cwd: Some("/tmp".into()),
            env: vec![("K".into(), "V".into())],
            resumed: true,
            max_line: 4096,
        }
    }

    #[test]
    fn a_spec_frame_round_trips() {
        let frame = encode_frame(&spec()).unwrap();
        assert_eq!(read(&frame[..]).unwrap(), spec());
    }

    #[test]
    fn bad_input_names_the_problem() {
        let err = read(&b""[..]).unwrap_err();
        assert!(err.to_string().contains("length prefix"), "{err}");
        let frame = encode_frame(&spec()).unwrap();
        let err = read(&frame[..frame.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("before the spec"), "{err}");
        let err = read(&[0xff, 0xff, 0xff, 0xff][..]).unwrap_err();
        assert!(err.to_string().contains("maximum"), "{err}");
        let err = read(&[0, 0, 0, 2, 0xff, 0xff][..]).unwrap_err();
        assert!(err.to_string().contains("not a valid ShimSpec"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }
}
