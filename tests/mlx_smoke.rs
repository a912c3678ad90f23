//! Smoke test of the MLX build: each fast / quantized kernel memexec relies on must equal a
//! straightforward composition of basic ops. Fails if MLX is mislinked or miscomputes.
use mlx_rs::{fast, ops, random, Array, Dtype};

type R<T> = Result<T, mlx_rs::error::Exception>;

fn normal(shape: &[i32], seed: u64) -> R<Array> {
    random::normal::<f32>(shape, None, None, &random::key(seed)?)
}

fn max_abs_diff(a: &Array, b: &Array) -> R<f32> {
    assert_eq!(a.shape(), b.shape(), "shapes differ");
    let d = ops::abs(&ops::subtract(a, b)?)?.max(None)?;
    d.eval()?;
    Ok(d.item_exact::<f32>())
}

#[test]
fn quantized_matmul_equals_dense_matmul_with_dequantized_weight() -> R<()> {
    let w = normal(&[128, 256], 0)?;
    let x = normal(&[3, 256], 1)?;
    for bits in [4, 8] {
        let (wq, scales, biases) = ops::quantize(&w, 64, bits)?;
        assert_eq!(wq.dtype(), Dtype::Uint32);
        assert_eq!(wq.shape(), &[128, 256 * bits / 32]);
        let y = ops::quantized_matmul(&x, &wq, &scales, &biases, true, 64, bits)?;
        let w_deq = ops::dequantize(&wq, &scales, &biases, 64, bits)?;
        let y_ref = ops::matmul(&x, ops::transpose(&w_deq)?)?;
        let diff = max_abs_diff(&y, &y_ref)?;
        assert!(diff < 1e-4, "{bits}-bit qmm vs dense: max diff {diff}");
        // The quantization itself must be close to the original weight, not garbage.
        let err = max_abs_diff(&w_deq, &w)?;
        assert!(
            err > 0.0 && err < 1.0,
            "{bits}-bit dequantization error {err}"
        );
    }
    Ok(())
}

#[test]
fn rms_norm_equals_composition() -> R<()> {
    let x = normal(&[2, 5, 64], 2)?;
    let w = normal(&[64], 3)?;
    let eps = 1e-6f32;
    let fast = fast::rms_norm(&x, Some(&w), eps)?;
    let ms = ops::mean_axis(&ops::square(&x)?, -1, true)?;
    let reference = ops::multiply(
        &ops::multiply(&x, &ops::rsqrt(&ops::add(&ms, Array::from_f32(eps))?)?)?,
        &w,
    )?;
    let diff = max_abs_diff(&fast, &reference)?;
    assert!(diff < 1e-5, "rms_norm max diff {diff}");
    Ok(())
}

/// Non-traditional (rotate-half) RoPE over all dims at a position offset.
fn rope_reference(x: &Array, base: f32, offset: i32) -> R<Array> {
    let shape = x.shape();
    let (len, dims) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let half = dims / 2;
    let i = ops::arange::<_, f32>(0, half, None)?;
    let inv_freq = ops::exp(&ops::multiply(
        &i,
        Array::from_f32(-2.0 * base.ln() / dims as f32),
    )?)?;
    let pos = ops::arange::<_, f32>(offset, offset + len, None)?;
    let theta = ops::multiply(&pos.reshape(&[len, 1])?, &inv_freq.reshape(&[1, half])?)?;
    let (cos, sin) = (ops::cos(&theta)?, ops::sin(&theta)?);
    let parts = ops::split_equal(x, 2, -1)?;
    let (x1, x2) = (&parts[0], &parts[1]);
    let r1 = ops::subtract(&ops::multiply(x1, &cos)?, &ops::multiply(x2, &sin)?)?;
    let r2 = ops::add(&ops::multiply(x1, &sin)?, &ops::multiply(x2, &cos)?)?;
    ops::concatenate(&[r1, r2], -1)
}

#[test]
fn rope_equals_composition() -> R<()> {
    let x = normal(&[1, 4, 7, 32], 4)?;
    for offset in [0, 13] {
        let fast = fast::rope(&x, 32, false, 10000.0, 1.0, offset, None)?;
        let reference = rope_reference(&x, 10000.0, offset)?;
        let diff = max_abs_diff(&fast, &reference)?;
        assert!(diff < 1e-4, "rope offset {offset}: max diff {diff}");
    }
    Ok(())
}

#[test]
fn scaled_dot_product_attention_equals_composition() -> R<()> {
    // GQA: 4 query heads over 2 kv heads, a causal mask as an additive array.
    let (l, d) = (6, 16);
    let q = normal(&[1, 4, l, d], 5)?;
    let k = normal(&[1, 2, l, d], 6)?;
    let v = normal(&[1, 2, l, d], 7)?;
    let scale = 0.25f32;
    let neg = ops::triu(&ops::full::<f32>(&[l, l], Array::from_f32(-1e9))?, 1)?;
    let fast = fast::scaled_dot_product_attention(&q, &k, &v, scale, &neg, None)?;
    let rep = |a: &Array| -> R<Array> { ops::repeat_axis::<f32>(a.clone(), 2, 1) };
    let (k2, v2) = (rep(&k)?, rep(&v)?);
    let scores = ops::add(
        &ops::multiply(
            &ops::matmul(&q, &ops::swap_axes(&k2, -1, -2)?)?,
            Array::from_f32(scale),
        )?,
        &neg,
    )?;
    let reference = ops::matmul(&ops::softmax_axis(&scores, -1, true)?, &v2)?;
    let diff = max_abs_diff(&fast, &reference)?;
    assert!(diff < 1e-5, "sdpa max diff {diff}");
    Ok(())
}
