//! What can be reduced: [`Element`] types and [`ReduceOp`]s.

use std::fmt;
use std::str::FromStr;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
}

/// The reduction applied element-wise across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum over ranks (i32 wraps on overflow).
    Sum,
    /// Sum, then divided by the world size (i32: integer division, truncating toward zero).
    Mean,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        })
    }
}

/// A reduce-op name that is none of `sum|mean|min|max`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reduce op '{0}' (expected sum|mean|min|max)")]
pub struct ParseReduceOpError(pub String);

impl FromStr for ReduceOp {
    type Err = ParseReduceOpError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "mean" | "avg" | "average" => Ok(ReduceOp::Mean),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            _ => Err(ParseReduceOpError(s.to_string())),
        }
    }
}

/// An element type the collectives reduce: `f32`, `f64` or `i32` (sealed).
///
/// Buffers travel as their in-memory bytes (`bytemuck`), which is the little-endian wire
/// format on the little-endian hosts gradwire supports.
pub trait Element:
    bytemuck::Pod + PartialOrd + Send + Sync + fmt::Debug + sealed::Sealed + 'static
{
    /// Combines `other` into `acc` element-wise (`Mean` adds; see [`Element::divide`]).
    fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self]);
    /// Divides every element by `n` (the second half of [`ReduceOp::Mean`]).
    fn divide(acc: &mut [Self], n: usize);
}

/// `acc[i] += other[i]`, the hot loop of every all-reduce: compiled twice on x86-64, for
/// the baseline (SSE2) and for AVX2, and picked at run time (the check is a cached load).
/// Same operations in the same order either way, so results are bit-identical across ranks
/// whatever their CPUs.
fn add_slices<T: Copy + std::ops::AddAssign>(acc: &mut [T], other: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { add_slices_avx2(acc, other) };
        return;
    }
    acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_slices_avx2<T: Copy + std::ops::AddAssign>(acc: &mut [T], other: &[T]) {
    acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b)
}

macro_rules! float_element {
    ($t:ty) => {
        impl Element for $t {
            fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self]) {
                debug_assert_eq!(acc.len(), other.len());
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => add_slices(acc, other),
                    ReduceOp::Min => acc.iter_mut().zip(other).for_each(|(a, b)| *a = a.min(*b)),
                    ReduceOp::Max => acc.iter_mut().zip(other).for_each(|(a, b)| *a = a.max(*b)),
                }
            }
            fn divide(acc: &mut [Self], n: usize) {
                if n.is_power_of_two() && n < (1 << 60) {
                    // 1/n is exact, so `a * (1/n)` rounds the same real number `a / n` does:
                    // bit-identical to the division, and a multiply is several times cheaper.
                    let inv = 1.0 / (n as $t);
                    scale_slice(acc, inv);
                } else {
                    let n = n as $t;
                    div_slice(acc, n);
                }
            }
        }
    };
}

/// `acc[i] *= k`, dispatched like [`add_slices`].
fn scale_slice<T: Copy + std::ops::MulAssign>(acc: &mut [T], k: T) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { scale_slice_avx2(acc, k) };
        return;
    }
    acc.iter_mut().for_each(|a| *a *= k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_slice_avx2<T: Copy + std::ops::MulAssign>(acc: &mut [T], k: T) {
    acc.iter_mut().for_each(|a| *a *= k)
}

/// `acc[i] /= n`, dispatched like [`add_slices`].
fn div_slice<T: Copy + std::ops::DivAssign>(acc: &mut [T], n: T) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { div_slice_avx2(acc, n) };
        return;
    }
    acc.iter_mut().for_each(|a| *a /= n)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn div_slice_avx2<T: Copy + std::ops::DivAssign>(acc: &mut [T], n: T) {
    acc.iter_mut().for_each(|a| *a /= n)
}
float_element!(f32);
float_element!(f64);

impl Element for i32 {
    fn reduce(op: ReduceOp, acc: &mut [Self], other: &[Self]) {
        debug_assert_eq!(acc.len(), other.len());
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = a.wrapping_add(*b)),
            ReduceOp::Min => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).min(*b)),
            ReduceOp::Max => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).max(*b)),
        }
    }
    fn divide(acc: &mut [Self], n: usize) {
        let n = n as i32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
}

/// Finishes a reduction on `acc` (the divide of `Mean`; nothing for the others).
pub(crate) fn finish<E: Element>(op: ReduceOp, acc: &mut [E], world: usize) {
    if op == ReduceOp::Mean && world > 1 {
        E::divide(acc, world);
    }
}

/// The bytes of an element slice.
pub(crate) fn bytes<E: Element>(s: &[E]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// The bytes of a mutable element slice.
pub(crate) fn bytes_mut<E: Element>(s: &mut [E]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mean's divide equals IEEE division bit for bit, for powers of two (done as a
    /// multiply) and other counts, on normal, subnormal, huge, signed-zero, infinite and NaN
    /// values.
    #[test]
    fn divide_is_bit_identical_to_division() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -3.5,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::MIN_POSITIVE * 3.0,
            1.0e-40,
            -7.0e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            vals.push(f32::from_bits(x));
        }
        let v64: Vec<f64> = vals.iter().map(|&v| v as f64 * 1e-300).collect();
        for n in [1usize, 2, 3, 4, 5, 7, 8, 16, 64, 1000, 1024, 1 << 20] {
            check_divide(&vals, n, |v| v / n as f32);
            check_divide(&v64, n, |v| v / n as f64);
        }
    }

    /// Checks [`Element::divide`] of `vals` by `n` against `div` (IEEE division): the same
    /// bits, or NaN for NaN.
    fn check_divide<E: Element + fmt::LowerExp>(vals: &[E], n: usize, div: impl Fn(E) -> E) {
        let mut got = vals.to_vec();
        E::divide(&mut got, n);
        for (&v, &g) in vals.iter().zip(&got) {
            let want = div(v);
            #[allow(clippy::eq_op)] // NaN is the value that differs from itself.
            let both_nan = g != g && want != want;
            assert!(
                bytemuck::bytes_of(&g) == bytemuck::bytes_of(&want) || both_nan,
                "{v:e} / {n}: {g:e} != {want:e}"
            );
        }
    }

    #[test]
    fn ops() {
        let mut a = [1i32, 5, -3];
        i32::reduce(ReduceOp::Max, &mut a, &[2, 4, -4]);
        assert_eq!(a, [2, 5, -3]);
        i32::reduce(ReduceOp::Min, &mut a, &[0, 9, -9]);
        assert_eq!(a, [0, 5, -9]);
        i32::reduce(ReduceOp::Sum, &mut a, &[i32::MAX, 0, 0]);
        assert_eq!(a, [i32::MAX, 5, -9]);
        i32::divide(&mut a, 2);
        assert_eq!(a, [i32::MAX / 2, 2, -4]);
        let mut f = [1.0f32, 2.0];
        f32::reduce(ReduceOp::Mean, &mut f, &[3.0, 4.0]);
        f32::divide(&mut f, 2);
        assert_eq!(f, [2.0, 3.0]);
        assert_eq!("MAX".parse::<ReduceOp>().unwrap(), ReduceOp::Max);
        assert!("prod".parse::<ReduceOp>().is_err());
    }
}
