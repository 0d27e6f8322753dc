//! What the codecs' unit tests share: reading a configuration, and the checks every stateful
//! codec and every decoder goes through.

use crate::{Codec, ConfigError, DecodeError, Params};

/// The configuration `parse` reads from `spec` (`name:key=value,...`), which uses every
/// parameter it names.
pub(crate) fn config<C>(
    spec: &str,
    parse: impl FnOnce(&mut Params) -> Result<C, ConfigError>,
) -> C {
    let mut p = Params::parse(spec).unwrap();
    let cfg = parse(&mut p).unwrap();
    p.finish().unwrap();
    cfg
}

/// Loads `c`'s saved state into `resumed` (a codec of the same configuration) and checks that
/// both then encode each of `grads` to the same bytes (a training that stops resumes bit for
/// bit); returns the state.
pub(crate) fn assert_resumes<C: Codec>(
    c: &mut C,
    resumed: &mut C,
    grads: impl IntoIterator<Item = Vec<f32>>,
) -> Vec<u8> {
    let state = c.save_state();
    resumed.load_state(&state).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for g in grads {
        c.encode(&g, &mut a);
        resumed.encode(&g, &mut b);
        assert_eq!(a, b);
    }
    state
}

/// Encodes each of `grads` with `c`, a codec with a residual, and checks that it conserves the
/// signal: what a payload sends plus the residual after it is the gradient plus the residual
/// before it, to within `tol * (1 + |gradient + residual|)`.
pub(crate) fn assert_conserves<C: Codec>(
    c: &mut C,
    residual: impl Fn(&C) -> &[f32],
    grads: impl IntoIterator<Item = Vec<f32>>,
    tol: f32,
) {
    let mut out = Vec::new();
    let mut before: Vec<f32> = residual(c).to_vec();
    for g in grads {
        before.resize(g.len(), 0.0);
        c.encode(&g, &mut out);
        let mut sent = vec![0.0f32; g.len()];
        c.decode_add(&out, &mut sent).unwrap();
        let after = residual(c);
        for i in 0..g.len() {
            let (lhs, rhs) = (sent[i] + after[i], g[i] + before[i]);
            assert!(
                (lhs - rhs).abs() <= tol * (1.0 + rhs.abs()),
                "{i}: {lhs} {rhs}"
            );
        }
        before = after.to_vec();
    }
}

/// `payload` with `bytes` written over it at `at`.
pub(crate) fn patched(payload: &[u8], at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    p[at..at + bytes.len()].copy_from_slice(bytes);
    p
}

/// What `c` says of `payload`, a malformed payload of `n` elements it must refuse without
/// touching the accumulator.
pub(crate) fn refused(c: &dyn Codec, payload: &[u8], n: usize) -> DecodeError {
    let mut acc = vec![0.0; n];
    let e = c
        .decode_add(payload, &mut acc)
        .expect_err("a malformed payload decodes");
    assert!(
        acc.iter().all(|&v| v == 0.0),
        "{e}: the accumulator changed"
    );
    e
}

/// Checks that `c` refuses every truncation of `payload` (of `n` elements).
pub(crate) fn assert_refuses_cuts(c: &dyn Codec, payload: &[u8], n: usize) {
    for cut in 0..payload.len() {
        refused(c, &payload[..cut], n);
    }
}
