//! burn plumbing: parameters and gradients in and out of a module as one flat `f32` buffer,
//! in the module's visitor (declaration) order, which is the same in every process.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Gradients;

/// Per-tensor element counts in flat order.
pub(crate) fn layout<M: Module>(m: &M) -> Vec<usize> {
    struct Sizes(Vec<usize>);
    impl ModuleVisitor for Sizes {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0.push(p.lazy_shape().num_elements());
        }
    }
    let mut v = Sizes(Vec::new());
    m.visit(&mut v);
    v.0
}

/// One parameter tensor as the module declares it: its dotted path (`fc1.weight`), shape,
/// and the type of the module holding it (`Linear`, `Conv2d`, `CharLstm`, ...).
pub(crate) struct ParamPath {
    pub(crate) path: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) holder: String,
}

/// Every parameter tensor's path, shape and holder, in flat order.
pub(crate) fn param_paths<M: Module>(m: &M) -> Vec<ParamPath> {
    struct Paths {
        stack: Vec<(String, String)>,
        out: Vec<ParamPath>,
    }
    impl ModuleVisitor for Paths {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.stack
                .push((name.to_string(), container_type.to_string()));
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.stack.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let path = self
                .stack
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(".");
            let holder = self.stack.last().map_or("", |(_, t)| t.as_str());
            self.out.push(ParamPath {
                path,
                shape: p.lazy_shape().to_vec(),
                holder: holder.trim_start_matches("Struct:").to_string(),
            });
        }
    }
    let mut v = Paths {
        stack: Vec::new(),
        out: Vec::new(),
    };
    m.visit(&mut v);
    v.out
}

/// Appends every parameter's values to `out`.
pub(crate) fn read_params<M: Module>(m: &M, out: &mut Vec<f32>) {
    struct Read<'a>(&'a mut Vec<f32>);
    impl ModuleVisitor for Read<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            extend_from(self.0, p.val().into_data());
        }
    }
    m.visit(&mut Read(out));
}

/// Replaces every parameter with the next values of `flat` (on `device`, tracked for
/// gradients when `device` is an autodiff device). `flat` must be exactly the layout's total.
pub(crate) fn write_params<M: Module>(m: M, flat: &[f32], device: &Device) -> M {
    struct Write<'a> {
        flat: &'a [f32],
        off: usize,
        device: Device,
    }
    impl ModuleMapper for Write<'_> {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let shape = p.lazy_shape();
            let n = shape.num_elements();
            let v = self.flat[self.off..self.off + n].to_vec();
            self.off += n;
            let dev = self.device.clone();
            p.map(move |_| {
                let t = Tensor::<D>::from_data(TensorData::new(v, shape), &dev);
                if dev.is_autodiff() {
                    t.require_grad()
                } else {
                    t
                }
            })
        }
    }
    let mut w = Write {
        flat,
        off: 0,
        device: device.clone(),
    };
    let m = m.map(&mut w);
    debug_assert_eq!(w.off, flat.len());
    m
}

/// Moves every parameter's gradient out of `grads` into `out` (cleared first); a parameter
/// without a gradient contributes zeros, so the layout is always complete.
pub(crate) fn take_grads<M: Module>(m: &M, grads: &mut Gradients, out: &mut Vec<f32>) {
    struct Take<'a> {
        grads: &'a mut Gradients,
        out: &'a mut Vec<f32>,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            match p.val().grad_remove(self.grads) {
                Some(g) => extend_from(self.out, g.into_data()),
                None => {
                    let n = p.lazy_shape().num_elements();
                    self.out.extend(std::iter::repeat_n(0.0, n));
                }
            }
        }
    }
    out.clear();
    m.visit(&mut Take { grads, out });
}

/// Appends a tensor's values (converted to f32 if stored otherwise).
pub(crate) fn extend_from(out: &mut Vec<f32>, data: TensorData) {
    match data.as_slice::<f32>() {
        Ok(s) => out.extend_from_slice(s),
        Err(_) => out.extend(data.iter::<f32>()),
    }
}
