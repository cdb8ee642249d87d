//! f64 references with the size of each element's terms (`sum |a_i| |b_i|` of what it
//! adds up), so that checks can bound every element's error relative to them: the matrix
//! product and flash attention forward and backward (grouped-query heads, causal or full,
//! strided like `kernels_lib::flash_attention::Shape`, with a score modification or
//! without). Used by the tests, the `gqa_attention` example and the benchmarks.

use kernels_lib::flash_attention::Shape;

/// `c[m, n] = a[m, k] b[k, n]` with `a` and `b` addressed through element strides (row,
/// column), row-major out, with the terms' size `sum_p |a_ip| |b_pj|` of each element.
pub fn matmul(a: &[f64], sa: (usize, usize), b: &[f64], sb: (usize, usize), (m, n, k): (usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut terms) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for p in 0..k {
            let x = a[i * sa.0 + p * sa.1];
            for j in 0..n {
                let y = b[p * sb.0 + j * sb.1];
                c[i * n + j] += x * y;
                terms[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, terms)
}

/// The attention forward pass in f64, in the query layout of `c`: the output, the size of
/// its terms (`sum_j p_j |v_j|`, `p` normalised), and per (batch, head, query) row (index
/// `(b * H + h) * T + i`) the log of the softmax denominator and the largest score's size
/// (`scale * sum_d |q_d k_d|`, which bounds how input rounding moves the scores).
pub struct Forward {
    pub o: Vec<f64>,
    pub o_terms: Vec<f64>,
    pub lse: Vec<f64>,
    pub score_size: Vec<f64>,
}

/// A score modification (see `kernels_lib::flash_attention::ScoreMod`): of the scaled
/// score `s` of (batch, query head, query, key), the modified score and its derivative.
pub type ScoreFn<'a> = &'a dyn Fn(f64, usize, usize, usize, usize) -> (f64, f64);

/// Scores as they are.
pub fn unmodified(s: f64, _: usize, _: usize, _: usize, _: usize) -> (f64, f64) {
    (s, 1.0)
}

/// Every (batch, query head, query) row's modified scores against the keys it sees, their
/// derivatives, and its key/value offsets: what the forward and backward references share.
fn rows(c: &Shape, q: &[f64], k: &[f64], scale: f64, m: ScoreFn<'_>, mut each: impl FnMut(usize, usize, usize, &[f64], &[f64], &dyn Fn(usize) -> usize)) {
    let (sq, sk) = (c.strides(c.heads), c.strides(c.kv_heads));
    for b in 0..c.batch {
        for h in 0..c.heads {
            let hk = h / (c.heads / c.kv_heads);
            for i in 0..c.seq {
                let qi = b * sq[0] + h * sq[1] + i * sq[2];
                let kj = |j: usize| b * sk[0] + hk * sk[1] + j * sk[2];
                let keys = if c.causal { i + 1 } else { c.seq };
                let (s, g): (Vec<f64>, Vec<f64>) = (0..keys).map(|j| m(scale * (0..c.head_dim).map(|d| q[qi + d] * k[kj(j) + d]).sum::<f64>(), b, h, i, j)).unzip();
                each((b * c.heads + h) * c.seq + i, qi, keys, &s, &g, &kj);
            }
        }
    }
}

/// `softmax(scale q k^T) v` per (batch, query head): see [`Forward`].
pub fn attention(c: &Shape, q: &[f64], k: &[f64], v: &[f64], scale: f64) -> Forward {
    attention_scored(c, q, k, v, scale, &unmodified)
}

/// [`attention`] with the scores modified by `m`. A row whose every score is masked
/// (`-inf`) has a zero output and an `lse` of `-inf`.
pub fn attention_scored(c: &Shape, q: &[f64], k: &[f64], v: &[f64], scale: f64, m: ScoreFn<'_>) -> Forward {
    let n = c.batch * c.heads * c.seq;
    let mut f = Forward { o: vec![0.0; q.len()], o_terms: vec![0.0; q.len()], lse: vec![0.0; n], score_size: vec![0.0; n] };
    let hd = c.head_dim;
    rows(c, q, k, scale, m, |r, qi, keys, s, _, kj| {
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            f.lse[r] = m;
            return;
        }
        let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
        f.lse[r] = m + l.ln();
        f.score_size[r] = (0..keys).map(|j| scale * (0..hd).map(|d| (q[qi + d] * k[kj(j) + d]).abs()).sum::<f64>()).fold(0.0, f64::max);
        for (j, sj) in s.iter().enumerate() {
            let p = (sj - m).exp() / l;
            for d in 0..hd {
                f.o[qi + d] += p * v[kj(j) + d];
                f.o_terms[qi + d] += p * v[kj(j) + d].abs();
            }
        }
    });
    f
}

/// The attention backward pass in f64 for the output gradient `dout`: `[(dq, terms), (dk,
/// terms), (dv, terms)]` in the inputs' layouts, each with the size of the terms it adds
/// up (`|dS|`'s terms `p (|dO| |v| + |dO| |o|)` times `|k|` or `|q|`, and `p |dO|` for
/// `dv`). `dk` and `dv` of a key/value head sum over its group of query heads.
pub fn attention_backward(c: &Shape, q: &[f64], k: &[f64], v: &[f64], dout: &[f64], scale: f64) -> [(Vec<f64>, Vec<f64>); 3] {
    attention_backward_scored(c, q, k, v, dout, scale, &unmodified)
}

/// [`attention_backward`] with the scores modified by `m`: the scores' gradient times
/// the modification's derivative (a fully masked row adds nothing).
pub fn attention_backward_scored(c: &Shape, q: &[f64], k: &[f64], v: &[f64], dout: &[f64], scale: f64, m: ScoreFn<'_>) -> [(Vec<f64>, Vec<f64>); 3] {
    let hd = c.head_dim;
    let z = |n: usize| (vec![0.0; n], vec![0.0; n]);
    let (mut dq, mut dk, mut dv) = (z(q.len()), z(k.len()), z(k.len()));
    rows(c, q, k, scale, m, |_, qi, keys, s, g, kj| {
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return;
        }
        let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / l).collect();
        let o: Vec<f64> = (0..hd).map(|d| (0..keys).map(|j| p[j] * v[kj(j) + d]).sum()).collect();
        let delta: f64 = (0..hd).map(|d| dout[qi + d] * o[d]).sum();
        let delta_abs: f64 = (0..hd).map(|d| (dout[qi + d] * o[d]).abs()).sum();
        for j in 0..keys {
            let dp: f64 = (0..hd).map(|d| dout[qi + d] * v[kj(j) + d]).sum();
            let dp_abs: f64 = (0..hd).map(|d| (dout[qi + d] * v[kj(j) + d]).abs()).sum();
            let (ds, ds_abs) = (p[j] * (dp - delta) * g[j], p[j] * (dp_abs + delta_abs) * g[j].abs());
            for d in 0..hd {
                dv.0[kj(j) + d] += p[j] * dout[qi + d];
                dv.1[kj(j) + d] += p[j] * dout[qi + d].abs();
                dk.0[kj(j) + d] += scale * ds * q[qi + d];
                dk.1[kj(j) + d] += scale * ds_abs * q[qi + d].abs();
                dq.0[qi + d] += scale * ds * k[kj(j) + d];
                dq.1[qi + d] += scale * ds_abs * k[kj(j) + d].abs();
            }
        }
    });
    [dq, dk, dv]
}
