//! The shim's one input: a [`ShimSpecFull`] that the daemon writes to its
//! stdin as one codec frame (a big-endian `u32` length, then the postcard
//! body) before closing it. A plain [`ShimSpec`], as an older daemon wrote,
//! is read as one with the default setup: the two never parse as each
//! other, since the full one has fields after the plain one's and a
//! message must take its whole frame.

use std::io::Read;

use tether_protocol::codec::decode_message;
use tether_protocol::{ShimSpec, ShimSpecFull, DEFAULT_MAX_FRAME_LEN};

use crate::error::{Error, Result};

/// Reads and decodes the spec. A missing, cut-short, oversized or
/// malformed frame is an [`Error::Usage`] that says what arrived, since
/// the usual cause is starting the shim by hand.
pub fn read(mut input: impl Read) -> Result<ShimSpecFull> {
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
    if let Ok(full) = decode_message::<ShimSpecFull>(&body) {
        return Ok(full);
    }
    let spec: ShimSpec = decode_message(&body)
        .map_err(|e| Error::Usage(format!("the spec on stdin is not a valid ShimSpec: {e}")))?;
    Ok(ShimSpecFull {
        spec,
        whole_env: false,
        pty: false,
        last_exit: None,
    })
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
        let full = ShimSpecFull {
            spec: spec(),
            whole_env: true,
            pty: true,
            last_exit: Some("code:3".into()),
        };
        let frame = encode_frame(&full).unwrap();
        assert_eq!(read(&frame[..]).unwrap(), full);
    }

    #[test]
    fn a_plain_spec_reads_with_the_default_setup() {
        let frame = encode_frame(&spec()).unwrap();
        let full = read(&frame[..]).unwrap();
        assert_eq!(full.spec, spec());
        assert!(!full.whole_env && !full.pty && full.last_exit.is_none());
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
