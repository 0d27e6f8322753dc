//! Run-time CPU dispatch for the hot loops.
//!
//! The workspace builds for baseline x86-64 (SSE2). [`multiversion!`] compiles a function's
//! body twice: once as is, once inside a `#[target_feature(enable = "avx2,fma")]` function
//! (closures defined in it inherit the features, and `#[inline(always)]` helpers are
//! inlined into it), and calls the second when the CPU has AVX2 and FMA (detected once,
//! cached by std). Results are bit-identical either way: Rust never contracts `a * b + c`
//! into an FMA nor reassociates float sums, so only the instruction width changes.

/// Whether this CPU runs the AVX2 + FMA versions.
#[inline(always)]
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `fn name(args) -> ret { body }` with an AVX2 + FMA copy of `body` chosen at run
/// time. Arguments must be plain identifiers; at most one `const` generic. Exported for the
/// other crates' hot loops (the engine's adders), so there is one dispatch in the workspace.
#[macro_export]
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(<const $g:ident : $gt:ty>)? ($($arg:ident : $ty:ty),* $(,)?)
        $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name $(<const $g: $gt>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn fast $(<const $g: $gt>)? ($($arg: $ty),*) $(-> $ret)? $body
                if $crate::simd::has_avx2() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked by `has_avx2`).
                    return unsafe { fast $(::<$g>)? ($($arg),*) };
                }
            }
            $body
        }
    };
}
pub(crate) use crate::multiversion;
