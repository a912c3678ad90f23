//! Element-wise helpers written op for op like their mlx-lm / mlx.nn counterparts, with
//! Python's "weak" scalars cast to the activation dtype so bf16 stays bf16.
use mlx_rs::ops::tanh;
use mlx_rs::{Array, Dtype};

use crate::error::Result;

/// A scalar of `dtype`, as MLX makes one from a Python float next to an array of that dtype.
pub fn scalar(v: f64, dtype: Dtype) -> Result<Array> {
    Ok(Array::from_f32(v as f32).as_dtype(dtype)?)
}

/// `nn.gelu_approx`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let half_x = scalar(0.5, dt)?.multiply(x)?;
    let cube = x.power(scalar(3.0, dt)?)?;
    let inner = x.add(scalar(0.044715, dt)?.multiply(&cube)?)?;
    let t = tanh(scalar((2.0 / std::f64::consts::PI).sqrt(), dt)?.multiply(&inner)?)?;
    Ok(half_x.multiply(scalar(1.0, dt)?.add(&t)?)?)
}

/// `tanh(x / cap) * cap`.
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    let c = scalar(cap as f64, x.dtype())?;
    Ok(tanh(x.divide(&c)?)?.multiply(&c)?)
}
