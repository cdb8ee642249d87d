//! `#[kernel(tune(..))]`: candidate configurations declared with the kernel, and the
//! generated `<name>_tuned` launch that runs the `autotune` crate's tuner over them.
//!
//! ```text
//! #[kernel(tune(BLOCK = [256, 512, 1024], warps = [2, 4, 8], key = [n], grid = (n as usize).div_ceil(BLOCK)))]
//! fn relu_mul_add<const BLOCK: usize>(a: Ptr<f32>, .., out: Ptr<f32>, n: i32) { .. }
//! // generates
//! fn relu_mul_add_tuned(rt: &Runtime, a: &Buffer<f32>, .., out: &mut Buffer<f32>, n: i32) -> Result<Config, TuneError>
//! ```
//!
//! A compile-time parameter listed with candidate values is tuned; one not listed is
//! the caller's: `<name>_tuned` takes it as a const generic of its own, in the kernel's
//! order (`attention_tuned::<T, .., D>`: the head dimension is given, the tiles tuned),
//! and each value gets a tuner of its own, as element types do. `warps` and
//! `stages` default to `[4]` and `[1]` and go to each launch's `LaunchConfig` (`num_stages`
//! pipelines loops that multiply tensor-core operands; for other kernels the tuner runs
//! candidates that differ only in it once), as do `specialize` (default `[false]`;
//! `[false, true]` tunes `LaunchConfig::warp_specialize`) and `programs` (default `[1]`;
//! e.g. `[1, 3]` tunes `LaunchConfig::min_programs_per_sm`, the programs an SM the
//! registers are budgeted for); `key` names
//! the integer parameters whose values (rounded up to powers of two) form the tuning key,
//! and may add named values computed from the launch (`elem = size_of::<T>()`, taken as
//! they are), which the tuner and `prune` see like the others;
//! `grid` is the number of programs, an expression of the parameters and the compile-time
//! constants, or a tuple of two or three such (a 2-D or 3-D grid, `LaunchConfig::grid3`);
//! `prune = f` keeps the candidates for which `f(&Config, &Key)` is true;
//! `reset_outputs = true` restores the outputs before every timed run (kernels that
//! accumulate into them); `prefetch = false` launches every candidate without
//! `LaunchConfig::prefetch` (a fixed choice, not tuned); `tolerance = t` sets the relative L2 difference allowed between
//! candidates' outputs. The generated function needs the `autotune` crate as a dependency
//! of the calling crate.
//!
//! A kernel generic over element types gets a `<name>_tuned` generic over them too
//! (`softmax_tuned::<T>`, inferred from the buffers): each element type has a tuner of its
//! own, named `softmax[T=bf16]` (its results file and its log lines), so instantiations
//! never share tuning results. Element types are not tuned: they are the caller's.

use crate::parse::{Kernel, ParamTy};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, ToTokens};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Error, Token};

pub struct Tune {
    pub consts: Vec<(syn::Ident, Vec<syn::Expr>)>,
    pub warps: Vec<syn::Expr>,
    pub stages: Vec<syn::Expr>,
    /// `specialize = [false, true]`: warp specialization as a tuned choice.
    pub specialize: Vec<syn::Expr>,
    /// `programs = [1, 3]`: programs an SM (`LaunchConfig::min_programs_per_sm`) as a
    /// tuned choice.
    pub programs: Vec<syn::Expr>,
    /// Integer parameters (bucketed to powers of two), then `name = expr` entries (exact).
    pub key: Vec<syn::Ident>,
    pub key_exprs: Vec<(syn::Ident, syn::Expr)>,
    pub grid: syn::Expr,
    /// `prune = path::to::fn(&Config, &Key) -> bool`.
    pub prune: Option<syn::Expr>,
    /// `reset_outputs = true`: the kernel reads its outputs (accumulates, in place).
    pub reset: bool,
    /// `tolerance = 1e-4`: allowed relative L2 difference between candidates' outputs.
    pub tolerance: Option<syn::Expr>,
    /// `prefetch = false`: every candidate launched without `LaunchConfig::prefetch`.
    pub prefetch: Option<bool>,
}

struct Arg {
    name: syn::Ident,
    value: syn::Expr,
}

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Arg> {
        let name: syn::Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        Ok(Arg { name, value: input.parse()? })
    }
}

fn list(e: &syn::Expr, what: &str) -> syn::Result<Vec<syn::Expr>> {
    match e {
        syn::Expr::Array(a) if !a.elems.is_empty() => Ok(a.elems.iter().cloned().collect()),
        other => Err(Error::new_spanned(other, format!("{what} takes a non-empty list, as in `[256, 512, 1024]`"))),
    }
}

/// Parse the attribute's arguments: empty, or `tune(..)`.
pub fn parse(attr: TokenStream, k: Option<&Kernel>) -> syn::Result<Option<Tune>> {
    if attr.is_empty() {
        return Ok(None);
    }
    let call: syn::ExprCall = syn::parse2(attr.clone()).map_err(|_| Error::new_spanned(&attr, "`#[kernel]` takes no arguments other than `tune(..)`"))?;
    match &*call.func {
        syn::Expr::Path(p) if p.path.is_ident("tune") => {}
        other => return Err(Error::new_spanned(other, "`#[kernel]` takes no arguments other than `tune(..)`")),
    }
    let args: Punctuated<Arg, Token![,]> = Punctuated::parse_terminated.parse2(call.args.to_token_stream())?;
    let mut t = Tune { consts: vec![], warps: vec![], stages: vec![], specialize: vec![], programs: vec![], key: vec![], key_exprs: vec![], grid: syn::parse_quote!(1), prune: None, reset: false, tolerance: None, prefetch: None };
    let mut grid = None;
    for a in args {
        match a.name.to_string().as_str() {
            "warps" => t.warps = list(&a.value, "`warps`")?,
            "stages" => t.stages = list(&a.value, "`stages`")?,
            "specialize" => {
                t.specialize = list(&a.value, "`specialize`")?;
                if let Some(e) = t.specialize.iter().find(|e| !matches!(e, syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(_), .. }))) {
                    return Err(Error::new_spanned(e, "`specialize` lists `false` and `true` (whether to warp-specialize a TMA loop, `LaunchConfig::warp_specialize`)"));
                }
            }
            "programs" => {
                t.programs = list(&a.value, "`programs`")?;
                let positive = |e: &syn::Expr| matches!(e, syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(i), .. }) if i.base10_parse::<u32>().is_ok_and(|v| v >= 1));
                if let Some(e) = t.programs.iter().find(|e| !positive(e)) {
                    return Err(Error::new_spanned(e, "`programs` lists integers of at least 1 (the programs an SM the kernel's registers are budgeted for, `LaunchConfig::min_programs_per_sm`)"));
                }
            }
            "grid" => grid = Some(a.value),
            "prune" => t.prune = Some(a.value),
            "tolerance" => t.tolerance = Some(a.value),
            "prefetch" => match &a.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. }) => t.prefetch = Some(b.value),
                other => return Err(Error::new_spanned(other, "`prefetch` is `true` or `false` (`LaunchConfig::prefetch` for every candidate)")),
            },
            "reset_outputs" => match &a.value {
                syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(b), .. }) => t.reset = b.value,
                other => return Err(Error::new_spanned(other, "`reset_outputs` is `true` or `false`")),
            },
            "key" => {
                for e in list(&a.value, "`key`")? {
                    match e {
                        syn::Expr::Path(p) if p.path.get_ident().is_some() => t.key.push(p.path.get_ident().unwrap().clone()),
                        syn::Expr::Assign(a) if matches!(&*a.left, syn::Expr::Path(p) if p.path.get_ident().is_some()) => {
                            let syn::Expr::Path(p) = &*a.left else { unreachable!() };
                            t.key_exprs.push((p.path.get_ident().unwrap().clone(), (*a.right).clone()));
                        }
                        other => return Err(Error::new_spanned(other, "`key` lists integer parameters of the kernel by name, or `name = expression` entries")),
                    }
                }
            }
            _ => t.consts.push((a.name.clone(), list(&a.value, &format!("`{}`", a.name))?)),
        }
    }
    t.grid = grid.ok_or_else(|| Error::new(call.span(), "`tune(..)` needs `grid = <number of programs>`, e.g. `grid = (n as usize).div_ceil(BLOCK)`"))?;
    if let Some(k) = k {
        for (c, _) in &t.consts {
            if k.type_param(&c.to_string()).is_some() {
                return Err(Error::new(c.span(), format!("`{c}` is an element type: it is not tuned but given by the buffers of each launch (`{}_tuned` is generic over it)", k.name)));
            }
            if !k.consts.iter().any(|kc| kc.name == *c) {
                return Err(Error::new(c.span(), format!("`{c}` is not a compile-time parameter of this kernel")));
            }
        }
        for key in &t.key {
            match k.params.iter().find(|p| p.name == *key) {
                Some(p) if matches!(&p.ty, ParamTy::Scalar(s) if s == "i32" || s == "i64") => {}
                _ => return Err(Error::new(key.span(), format!("`{key}` is not an integer parameter of this kernel"))),
            }
        }
    }
    Ok(Some(t))
}

/// The `<name>_tuned` launch function.
///
/// `lenient` (the kernel has errors that leave its written buffers unknown): a stub that
/// accepts any buffer arguments, so that calls to it add no errors of their own.
pub fn expand(k: &Kernel, writable: &[bool], t: &Tune, rust_type: impl Fn(&str) -> TokenStream, lenient: bool) -> TokenStream {
    let name = &k.name;
    let vis = &k.vis;
    let tuned = format_ident!("{}_tuned", name);
    let name_str = name.to_string();
    let params = k.params.iter().zip(writable).map(|(p, &w)| {
        let n = &p.name;
        match &p.ty {
            ParamTy::Ptr(_) if lenient => quote!(#n: impl ::core::marker::Sized),
            ParamTy::Ptr(e) => {
                let ty = rust_type(e);
                // Outputs are buffers (the tuner restores and compares them); inputs anything a
                // launch reads (a buffer, a host slice).
                if w { quote!(#n: &mut ::dsl_runtime::__private::Buffer<#ty>) } else { quote!(#n: impl ::dsl_runtime::__private::launch::InPtr<#ty> + ::core::marker::Copy) }
            }
            ParamTy::Scalar(s) | ParamTy::Value(s) => {
                let ty = rust_type(s);
                quote!(#n: #ty)
            }
        }
    });
    // The element type and helper parameters, with their bounds, and the compile-time
    // parameters the caller gives (those without candidates), in the kernel's order.
    let tuned_const = |c: &syn::Ident| t.consts.iter().any(|(n, _)| n == c);
    let (tnames, tdecl) = crate::expand::generic_decls(k, |c| !tuned_const(&c.name));
    let given: Vec<(&syn::Ident, &str)> = k.consts.iter().filter(|c| !tuned_const(&c.name)).map(|c| (&c.name, c.ty.as_str())).collect();
    let tgen = (!tdecl.is_empty()).then(|| quote!(<#(#tdecl),*>));
    if lenient {
        let params = params.collect::<Vec<_>>();
        return quote! {
            #[allow(clippy::too_many_arguments, unused_variables)]
            #vis fn #tuned #tgen (__rt: &::dsl_runtime::__private::Runtime, #(#params),*) -> ::std::result::Result<::autotune::Config, ::autotune::TuneError> {
                ::core::unreachable!("the kernel has errors")
            }
        };
    }
    let outs: Vec<&syn::Ident> = k.params.iter().zip(writable).filter(|(p, &w)| w && matches!(p.ty, ParamTy::Ptr(_))).map(|(p, _)| &p.name).collect();
    let call_args: Vec<TokenStream> = k
        .params
        .iter()
        .zip(writable)
        .map(|(p, &w)| {
            let n = &p.name;
            if w && matches!(p.ty, ParamTy::Ptr(_)) { quote!(&mut **#n) } else { quote!(#n) }
        })
        .collect();
    // The kernel with the configuration's constants as values: one expression for every
    // configuration, no match arm per combination of candidates.
    let (cs, cs_t) = crate::expand::consts_struct(k);
    let cvals = k.consts.iter().map(|c| {
        let (n, s) = (&c.name, c.name.to_string());
        if tuned_const(n) { quote!(__cfg.get(#s)) } else { quote!((#n) as i64) }
    });
    let consts = quote!([#(#cvals),*]);
    // The constants as the kernel's types, for the grid expression.
    let binds = crate::expand::bind_consts(k, quote!(__consts));
    let kernel_of = quote!(::core::option::Option::Some(::std::boxed::Box::new(#cs #cs_t::new(#consts)) as ::std::boxed::Box<dyn ::dsl_runtime::__private::Kernel>));
    let names = k.consts.iter().map(|c| c.name.to_string()).collect();
    let local = |e: &syn::Expr| crate::expand::with_const_locals(e.to_token_stream(), &names);
    let grid = match &t.grid {
        syn::Expr::Tuple(g) if (2..=3).contains(&g.elems.len()) => {
            let dims: Vec<TokenStream> = g.elems.iter().map(|e| {
                let e = local(e);
                quote!((#e) as u32)
            }).collect();
            let z = dims.get(2).cloned().unwrap_or(quote!(1));
            let (x, y) = (&dims[0], &dims[1]);
            quote!(::dsl_runtime::__private::LaunchConfig::grid3(#x, #y, #z))
        }
        g => {
            let g = local(g);
            quote!(::dsl_runtime::__private::LaunchConfig::grid((#g) as u32))
        }
    };
    let prefetch = t.prefetch.map(|b| quote!(.prefetch(#b)));
    let launch_of = quote! {{
        let __consts = #consts;
        #(#binds)*
        ::core::option::Option::Some(#cs #cs_t::new(__consts).launch(__rt, #grid.warps(__cfg.num_warps).stages(__cfg.num_stages).warp_specialize(__cfg.warp_specialize).min_programs_per_sm(__cfg.programs_per_sm)#prefetch, #(#call_args),*))
    }};
    let values = t.consts.iter().map(|(c, vals)| {
        let s = c.to_string();
        quote!(.values(#s, &[#((#vals) as i64),*]))
    });
    let warps = if t.warps.is_empty() { vec![syn::parse_quote!(4)] } else { t.warps.clone() };
    let stages = if t.stages.is_empty() { vec![syn::parse_quote!(1)] } else { t.stages.clone() };
    let specialize = if t.specialize.is_empty() { vec![syn::parse_quote!(false)] } else { t.specialize.clone() };
    let programs = if t.programs.is_empty() { vec![syn::parse_quote!(1)] } else { t.programs.clone() };
    let keys = t.key.iter().map(|kname| {
        let s = kname.to_string();
        quote!(.with(#s, (#kname) as i64, ::autotune::Bucket::NextPow2))
    });
    let key_exprs = t.key_exprs.iter().map(|(kname, e)| {
        let s = kname.to_string();
        quote!(.with(#s, (#e) as i64, ::autotune::Bucket::Exact))
    });
    let prune = t.prune.as_ref().map(|p| quote!(.prune(#p)));
    let reset = t.reset.then(|| quote!(.reset_outputs()));
    let tolerance = t.tolerance.as_ref().map(|e| quote!(.tolerance((#e) as f64)));
    let doc = format!("Launch `{name_str}` with the best of its `tune(..)` candidates for these arguments (tuning on first use of a key; see the `autotune` crate). Returns the configuration used.");
    let new_tuner = |name: TokenStream| quote!(::autotune::Autotuner::new(#name, ::autotune::Space::product() #(#values)* .warps(&[#(#warps),*]).stages(&[#(#stages),*]).specialize(&[#(#specialize),*]).programs(&[#(#programs),*])) #prune #reset #tolerance);
    // Given constants as types (`ConstUsize<D>`), so that each value is an instantiation
    // with a tuner of its own.
    let given_types: Vec<TokenStream> = given
        .iter()
        .map(|&(n, ty)| {
            let marker = format_ident!("Const{}", match ty {
                "usize" => "Usize",
                "u32" => "U32",
                "i32" => "I32",
                "i64" => "I64",
                _ => "Bool",
            });
            quote!(::dsl_runtime::__private::dsl::#marker<#n>)
        })
        .collect();
    let tuner = if tnames.is_empty() && given.is_empty() {
        let t = new_tuner(quote!(#name_str));
        quote! {
            static __TUNER: ::std::sync::OnceLock<::autotune::Autotuner> = ::std::sync::OnceLock::new();
            let __tuner = __TUNER.get_or_init(|| #t);
        }
    } else {
        // One tuner per instantiation (a static in a generic function is shared by all of
        // them), made on its first use and kept for the process.
        // `T=bf16`, `F=square`: each type parameter with its value, in the declared order.
        let parts = k.order.iter().filter_map(|g| match *g {
            crate::parse::GenParam::Type(i) => {
                let (n, s) = (&k.types[i].name, k.types[i].name.to_string());
                Some(quote!(::std::format!("{}={}", #s, <#n as ::dsl_runtime::__private::Element>::DTYPE)))
            }
            crate::parse::GenParam::Fn(i) => {
                let (n, s) = (&k.fns[i], k.fns[i].to_string());
                Some(quote!(::std::format!("{}={}", #s, <#n as ::dsl_runtime::__private::dsl::KernelFn>::NAME)))
            }
            crate::parse::GenParam::Const(i) if !tuned_const(&k.consts[i].name) => {
                let (n, s) = (&k.consts[i].name, k.consts[i].name.to_string());
                Some(quote!(::std::format!("{}={}", #s, #n)))
            }
            crate::parse::GenParam::Const(_) => None,
        });
        let t = new_tuner(quote!(&__name));
        quote! {
            static __TUNERS: ::std::sync::Mutex<::std::vec::Vec<(::std::any::TypeId, &'static ::autotune::Autotuner)>> = ::std::sync::Mutex::new(::std::vec::Vec::new());
            let __tuner: &'static ::autotune::Autotuner = {
                let __id = ::std::any::TypeId::of::<(#(#tnames,)* #(#given_types,)*)>();
                let mut __all = __TUNERS.lock().unwrap_or_else(::std::sync::PoisonError::into_inner);
                match __all.iter().find(|(id, _)| *id == __id) {
                    ::core::option::Option::Some(&(_, t)) => t,
                    ::core::option::Option::None => {
                        let __types: &[::std::string::String] = &[#(#parts),*];
                        let __name = ::std::format!("{}[{}]", #name_str, __types.join(","));
                        let t: &'static ::autotune::Autotuner = ::std::boxed::Box::leak(::std::boxed::Box::new(#t));
                        __all.push((__id, t));
                        t
                    }
                }
            };
        }
    };
    quote! {
        #[doc = #doc]
        #[allow(clippy::too_many_arguments, non_snake_case, unused_variables)]
        #vis fn #tuned #tgen (__rt: &::dsl_runtime::__private::Runtime, #(#params),*) -> ::std::result::Result<::autotune::Config, ::autotune::TuneError> {
            #tuner
            let __key = ::autotune::Key::new() #(#keys)* #(#key_exprs)*;
            __tuner.launch(
                __rt,
                &__key,
                &mut (#(#outs,)*),
                &|__cfg: &::autotune::Config| #kernel_of,
                &mut |__cfg: &::autotune::Config, (#(#outs,)*)| #launch_of,
            )
        }
    }
}
