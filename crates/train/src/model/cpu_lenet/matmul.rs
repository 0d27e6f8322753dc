//! Matrix views ([`Mat`]) and the GEMM every layer runs on ([`matmul`], over the `gemm`
//! crate).

use gemm::Parallelism;

/// A row-major or strided matrix view: element `(i, j)` at `i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

pub(crate) fn mat(data: &[f32], rs: usize, cs: usize) -> Mat<'_> {
    Mat { data, rs, cs }
}

/// Highest index a `rows x cols` view with strides `rs`, `cs` touches, plus one.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `dst[m x n] (+)= a[m x k] · b[k x n]` (added to `dst` when `accumulate`), with `dst`
/// row-major of row stride `dst_rs`.
///
/// # Panics
/// When a view does not fit its slice (a bug in this module, not a data error).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: Mat<'_>,
    b: Mat<'_>,
) {
    assert!(extent(m, n, dst_rs, 1) <= dst.len(), "matmul dst view");
    assert!(extent(m, k, a.rs, a.cs) <= a.data.len(), "matmul lhs view");
    assert!(extent(k, n, b.rs, b.cs) <= b.data.len(), "matmul rhs view");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(0.0);
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if threads > 1 && m * n * k >= 1 << 18 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the three views were checked against their slices' lengths above, `dst` is
    // borrowed mutably and does not alias `a` or `b` (shared borrows), and every stride
    // fits an `isize` because the views fit in allocated slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}
