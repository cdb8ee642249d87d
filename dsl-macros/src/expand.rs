//! Phase 3: generate the kernel's struct, its `dsl_runtime::Kernel` implementation (an IR
//! builder run once per specialization) and its typed launch functions.
//!
//! Kernel variables become Rust variables of type `dsl_runtime::ir::Operand`; every
//! operation becomes one builder call bound to a temporary, carrying the source location
//! of the DSL expression it came from (`line!()`/`column!()` spanned at that expression).
//! Compile-time `if`s stay Rust `if`s, evaluated while the IR is built.
//!
//! A kernel's element type parameter `T` is a type parameter of the struct, and its
//! `DType` is `<T as Element>::DTYPE` wherever the IR needs it. A `#[kernel_fn]` becomes a
//! function of the same name taking one `Operand` per parameter (so rustc checks every
//! call: that it exists, its arity), returning a struct of the same name (the call, not yet
//! inlined) that implements `dsl_runtime::dsl::KernelFnCall`; a call in a kernel or helper
//! body emits `inline_with(helper(args..), [consts..], __b, loc)`. A helper's type
//! parameters are not Rust generics: they are `DType` variables, inferred from the
//! arguments when the call is inlined (`HelperSite::bind`).
//!
//! Compile-time constants are values inside every IR builder: a kernel's `build` and a
//! helper's `inline` bind them as local variables (`let BLOCK: usize = ..`) from an `i64`
//! array. A kernel's builder lives in a hidden struct holding that array
//! (`__softmax_consts::<T>`); `softmax::<T, 1, 4096>` is it with the constants fixed, and
//! `tune(..)` makes it from a configuration, so one expansion serves every value. A
//! helper's constants are passed at each call (`KernelFnCall::Consts`).

use crate::builtins::{self, Arg, Bin, Build, Generics, Rule, Src};
use crate::parse::{self, Block, Errors, Expr, GenParam, Generic, Kernel, ParamTy, Sp, Stmt};
use crate::validate::{self, Facts};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use std::collections::{HashMap, HashSet};

pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errs = Errors::default();
    let item: syn::ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let parsed = parse::kernel(&item, false, &mut errs);
    let tune = match crate::tune::parse(attr, parsed.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            errs.add(e);
            None
        }
    };
    let Some(k) = parsed else {
        // The signature is unusable: emit the errors and a placeholder struct so that uses
        // of the kernel's name do not add errors of their own.
        let (vis, name) = (&item.vis, &item.sig.ident);
        let err = errs.combine().map(|e| e.to_compile_error());
        return quote! { #err #[allow(non_camel_case_types)] #vis struct #name; };
    };
    let facts = validate::check(&k, &mut errs);
    let errors = errs.combine().map(|e| e.to_compile_error());
    let body = if errors.is_none() { Gen::new(&k, &facts, kernel_dtypes(&k)).body(&k.body) } else { quote! {} };
    // A store through a pointer lost to an error leaves unknown which buffers are written
    // (`&mut`): the launch functions then accept any argument, so that calls passing `&mut`
    // for the buffer the kernel was meant to write add no errors of their own.
    let lenient = errors.is_some() && facts.unknown_writes;
    let items = wrapper(&k, &facts, body, lenient);
    let tuned = tune.map(|t| crate::tune::expand(&k, &facts.writable, &t, rust_type, lenient));
    quote! { #errors #items #tuned }
}

fn dtype_tokens(d: &str) -> TokenStream {
    match d {
        "f32" => quote!(::dsl_runtime::__private::DType::F32),
        "f16" => quote!(::dsl_runtime::__private::DType::F16),
        "bf16" => quote!(::dsl_runtime::__private::DType::BF16),
        "i32" => quote!(::dsl_runtime::__private::DType::I32),
        "i64" => quote!(::dsl_runtime::__private::DType::I64),
        "u8" => quote!(::dsl_runtime::__private::DType::U8),
        _ => quote!(::dsl_runtime::__private::DType::Bool),
    }
}

/// `#[kernel_fn]`: the function that makes a call, the struct of the call, and its
/// `KernelFnCall` implementation (the body, inlined at each call). See the module docs.
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errs = Errors::default();
    if !attr.is_empty() {
        errs.spanned(&attr, "`#[kernel_fn]` takes no arguments");
    }
    let item: syn::ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let Some(k) = parse::kernel(&item, true, &mut errs) else {
        return errs.combine().map(|e| e.to_compile_error()).unwrap_or_default();
    };
    let facts = validate::check(&k, &mut errs);
    let errors = errs.combine().map(|e| e.to_compile_error());
    let Kernel { vis, attrs, name, params, .. } = &k;
    let helper = k.helper.as_ref().expect("a helper");
    let name_str = name.to_string();
    let line = name.span().start().line as u32;
    // No Rust generics: element types are inferred when the call is inlined, and
    // compile-time constants are values each call passes (`KernelFnCall::Consts`).
    let nc = k.consts.len();
    let binds = bind_consts(&k, quote!(__consts));
    let n = params.len();
    let pnames: Vec<&syn::Ident> = params.iter().map(|p| &p.name).collect();
    // Each parameter an `Operand`, spanned as the type written, so that rustc's "function
    // defined here" shows the helper's own signature.
    let ptypes = params.iter().map(|p| {
        let s = p.ty_span.start;
        quote_spanned!(s=> ::dsl_runtime::__private::ir::Operand)
    });
    let tvars: Vec<syn::Ident> = k.types.iter().map(|t| format_ident!("__dtype_{}", t.name)).collect();
    let elem = |e: &str| match k.types.iter().position(|t| t.name == e) {
        Some(i) => quote!(::dsl_runtime::__private::dsl::inlining::Elem::Param(#i)),
        None => {
            let d = dtype_tokens(e);
            quote!(::dsl_runtime::__private::dsl::inlining::Elem::Is(#d))
        }
    };
    let want = |t: &ParamTy| match t {
        ParamTy::Ptr(e) => {
            let e = elem(e);
            quote!(::dsl_runtime::__private::dsl::inlining::Want::Ptr(#e))
        }
        ParamTy::Value(e) | ParamTy::Scalar(e) => {
            let e = elem(e);
            quote!(::dsl_runtime::__private::dsl::inlining::Want::Value(#e))
        }
    };
    let args = params.iter().enumerate().map(|(i, p)| {
        let (s, w) = (p.name.to_string(), want(&p.ty));
        quote!((#s, self.__args[#i], #w))
    });
    let tparams = k.types.iter().map(|t| {
        let (s, b) = (t.name.to_string(), format_ident!("{}", t.bound.name()));
        quote!((#s, ::dsl_runtime::__private::dsl::inlining::Bound::#b))
    });
    // Every helper this one calls, as `depth_of(&|| callee(..))`: what `DEPTH` is made of,
    // so that a cycle of helpers fails to compile. (A call of itself is an error already.)
    let depths: Vec<TokenStream> = helper_calls(&k.body, name).into_iter().map(|c| quote!(::dsl_runtime::__private::dsl::inlining::depth_of(&|| #c))).collect();
    let inline_body = if errors.is_none() {
        let dtypes = k.types.iter().zip(&tvars).map(|(t, v)| (t.name.to_string(), quote!(#v))).collect();
        let mut g = Gen::new(&k, &facts, dtypes);
        let mut stmts = vec![];
        let value = g.block_into(&k.body, &mut stmts);
        let result = match (&helper.ret, &k.body.tail) {
            (Some(r), Some(tail)) => {
                let (w, lc) = (want(r), loc(tail.span()));
                quote!(__site.result(__b, __value, #w, &[#(#tvars),*], #lc))
            }
            _ => quote!(::core::result::Result::Ok(__value)),
        };
        quote! {
            #(#binds)*
            let __site = ::dsl_runtime::__private::dsl::inlining::HelperSite { name: #name_str, file: file!(), line: #line, at: __at };
            let ([#(#pnames),*], [#(#tvars),*]) = __site.bind(__b, [#(#args),*], [#(#tparams),*])?;
            let __value = (|__b: &mut ::dsl_runtime::__private::ir::Builder| -> ::std::result::Result<::dsl_runtime::__private::ir::Operand, ::dsl_runtime::__private::BuildError> {
                #(#stmts)*
                ::core::result::Result::Ok(#value)
            })(__b)
            .map_err(|e| __site.wrap(e))?;
            #result
        }
    } else {
        // Never inlined into a program: the helper's errors stop the build.
        quote!(let _ = (__b, __at, __consts); ::core::unreachable!("the helper has errors"))
    };
    // Without constants, the helper can be a kernel's type parameter (`S: KernelFn`).
    let as_type = (nc == 0).then(|| {
        quote! {
            impl ::dsl_runtime::__private::dsl::KernelFn for #name {
                const NAME: &'static str = #name_str;
                const ARITY: usize = #n;
                fn call(args: &[::dsl_runtime::__private::ir::Operand]) -> ::core::option::Option<Self> {
                    ::core::option::Option::Some(#name { __args: args.try_into().ok()? })
                }
            }
        }
    });
    // A cycle of helpers makes `DEPTH` depend on itself: evaluating it here fails to compile.
    let check = quote!(const _: usize = <#name as ::dsl_runtime::__private::dsl::KernelFnCall>::DEPTH;);
    let call_doc = format!("A call of the `#[kernel_fn]` `{name_str}` with its arguments, inlined by the kernel that makes it.");
    let sig = params.iter().map(|p| format!("`{}: {}`", p.name, p.ty.spelling())).collect::<Vec<_>>().join(", ");
    let ret = helper.ret.as_ref().map(|r| format!(", returns `{}`", r.spelling())).unwrap_or_default();
    let fn_doc = format!("`#[kernel_fn]` ({sig}{ret}): callable from kernels and other helpers, where it is inlined.");
    quote! {
        #errors
        #[doc = #call_doc]
        #[allow(non_camel_case_types)]
        #vis struct #name {
            __args: [::dsl_runtime::__private::ir::Operand; #n],
        }

        #(#attrs)*
        ///
        #[doc = #fn_doc]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        #vis fn #name(#(#pnames: #ptypes),*) -> #name {
            #name { __args: [#(#pnames),*] }
        }

        impl ::dsl_runtime::__private::dsl::KernelFnCall for #name {
            const DEPTH: usize = 1 + ::dsl_runtime::__private::dsl::inlining::max_depth(&[#(#depths),*]);
            type Consts = [i64; #nc];
            #[allow(unused_variables, unused_mut, unused_parens, non_snake_case, clippy::all)]
            fn inline(self, __consts: [i64; #nc], __b: &mut ::dsl_runtime::__private::ir::Builder, __at: ::dsl_runtime::__private::ir::Loc) -> ::std::result::Result<::dsl_runtime::__private::ir::Operand, ::dsl_runtime::__private::BuildError> {
                let _ = <Self as ::dsl_runtime::__private::dsl::KernelFnCall>::DEPTH;
                #inline_body
            }
        }

        #as_type

        #check
    }
}

/// A kernel's element type parameters as `DType` expressions.
fn kernel_dtypes(k: &Kernel) -> HashMap<String, TokenStream> {
    k.types.iter().map(|t| (t.name.to_string(), type_dtype(&t.name))).collect()
}

/// The `DType` of a kernel's type parameter `T`.
fn type_dtype(t: &syn::Ident) -> TokenStream {
    quote!(<#t as ::dsl_runtime::__private::Element>::DTYPE)
}

/// `<T: ::dsl_runtime::__private::dsl::Float, const BLOCK: usize>`: a kernel's generic parameters as
/// declared, in their order.
pub fn generics_decl(k: &Kernel) -> TokenStream {
    let ps = k.order.iter().map(|g| match *g {
        GenParam::Type(i) => {
            let t = &k.types[i];
            let (name, bound) = (&t.name, format_ident!("{}", t.bound.name()));
            quote!(#name: ::dsl_runtime::__private::dsl::#bound)
        }
        GenParam::Const(i) => {
            let c = &k.consts[i];
            let (name, ty) = (&c.name, format_ident!("{}", c.ty));
            quote!(const #name: #ty)
        }
        GenParam::Fn(i) => {
            let f = &k.fns[i];
            quote!(#f: ::dsl_runtime::__private::dsl::KernelFn)
        }
    });
    quote!(<#(#ps),*>)
}

/// The kernel's type parameters (element types and helpers) in the order they are
/// declared, as names and as declarations with their bounds: what the hidden constants
/// struct, the `PhantomData`s and `<name>_tuned` are generic over (so `<name>_tuned::<..>`
/// takes them as `<name>::<..>` does).
pub fn type_generics(k: &Kernel) -> (Vec<&syn::Ident>, Vec<TokenStream>) {
    generic_decls(k, |_| false)
}

/// [`type_generics`] with the compile-time parameters `given` picks declared too (`const
/// D: usize`, in the kernel's order; not among the names): those of a `<name>_tuned` that
/// the caller gives.
pub fn generic_decls(k: &Kernel, given: impl Fn(&crate::parse::ConstParam) -> bool) -> (Vec<&syn::Ident>, Vec<TokenStream>) {
    let mut names = vec![];
    let mut decls = vec![];
    for g in &k.order {
        match *g {
            GenParam::Type(i) => {
                let t = &k.types[i];
                let (n, b) = (&t.name, format_ident!("{}", t.bound.name()));
                names.push(n);
                decls.push(quote!(#n: ::dsl_runtime::__private::dsl::#b));
            }
            GenParam::Fn(i) => {
                let f = &k.fns[i];
                names.push(f);
                decls.push(quote!(#f: ::dsl_runtime::__private::dsl::KernelFn));
            }
            GenParam::Const(i) if given(&k.consts[i]) => {
                let (n, ty) = (&k.consts[i].name, format_ident!("{}", k.consts[i].ty));
                decls.push(quote!(const #n: #ty));
            }
            GenParam::Const(_) => {}
        }
    }
    (names, decls)
}

/// `let BLOCK: usize = <its value in `from[i]`>;` for each compile-time constant: inside the
/// IR builders, constants are run-time values (so that one builder serves every value, and
/// `tune(..)` needs no match arm per combination).
pub fn bind_consts(k: &Kernel, from: TokenStream) -> Vec<TokenStream> {
    k.consts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (name, ty) = (const_local(&c.name), format_ident!("{}", c.ty));
            let v = if c.ty == "bool" { quote!(#from[#i] != 0) } else { quote!(#from[#i] as #ty) };
            quote!(let #name: #ty = #v;)
        })
        .collect()
}

/// The local variable that holds constant `c` in a builder: `__const_BLOCK`. Not `BLOCK`
/// itself: a `let` cannot bind a name that is also a constant in scope (a module's
/// `const BLOCK`), which a const generic could shadow.
pub fn const_local(c: &syn::Ident) -> syn::Ident {
    syn::Ident::new(&format!("__const_{c}"), c.span())
}

/// `ts` (Rust written in a kernel: a compile-time condition, a constant expression, a
/// `tune(..)` grid) with every mention of a constant in `consts` turned into its
/// [`const_local`] (not after `.` or `::`: fields, methods and paths keep their names).
pub fn with_const_locals(ts: TokenStream, consts: &HashSet<String>) -> TokenStream {
    use proc_macro2::TokenTree;
    let mut out = vec![];
    let mut prev_sep = false;
    for t in ts {
        let sep = matches!(&t, TokenTree::Punct(p) if p.as_char() == '.' || p.as_char() == ':');
        out.push(match t {
            TokenTree::Ident(i) if !prev_sep && consts.contains(&i.to_string()) => TokenTree::Ident(const_local(&i)),
            TokenTree::Group(g) => {
                let mut n = proc_macro2::Group::new(g.delimiter(), with_const_locals(g.stream(), consts));
                n.set_span(g.span());
                TokenTree::Group(n)
            }
            other => other,
        });
        prev_sep = sep;
    }
    out.into_iter().collect()
}

/// `[BLOCK as i64, ..]`: the kernel's constants as the `i64`s its builder reads.
fn consts_array(k: &Kernel) -> TokenStream {
    let names = k.consts.iter().map(|c| &c.name);
    quote!([#((#names) as i64),*])
}

/// The hidden struct that builds and launches the kernel with its constants as values
/// (`__softmax_consts::<T>`), and its element types as a turbofish.
pub fn consts_struct(k: &Kernel) -> (syn::Ident, TokenStream) {
    let (tnames, _) = type_generics(k);
    let turbofish = if tnames.is_empty() { quote!() } else { quote!(::<#(#tnames),*>) };
    (format_ident!("__{}_consts", k.name), turbofish)
}

/// `<T, BLOCK>`: the generic parameters as arguments, in their order.
pub fn generics_use(k: &Kernel) -> TokenStream {
    let ps = generic_names(k);
    quote!(<#(#ps),*>)
}

fn generic_names(k: &Kernel) -> Vec<&syn::Ident> {
    k.order
        .iter()
        .map(|g| match *g {
            GenParam::Type(i) => &k.types[i].name,
            GenParam::Const(i) => &k.consts[i].name,
            GenParam::Fn(i) => &k.fns[i],
        })
        .collect()
}

pub fn rust_type(d: &str) -> TokenStream {
    match d {
        "f16" => quote!(::dsl_runtime::__private::half::f16),
        "bf16" => quote!(::dsl_runtime::__private::half::bf16),
        other => {
            let i = format_ident!("{}", other);
            quote!(#i)
        }
    }
}

fn wrapper(k: &Kernel, facts: &Facts, body: TokenStream, lenient: bool) -> TokenStream {
    let Kernel { vis, attrs, name, params, .. } = k;
    let name_str = name.to_string();
    let generics_decl = generics_decl(k);
    let generics_use = generics_use(k);
    let line = name.span().start().line as u32;
    let pnames: Vec<_> = params.iter().map(|p| &p.name).collect();
    let dt = |e: &str| match k.type_param(e) {
        Some(t) => type_dtype(&t.name),
        None => dtype_tokens(e),
    };
    let pkinds: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| match &p.ty {
            ParamTy::Ptr(e) => {
                let d = dt(e);
                quote!(::dsl_runtime::__private::ir::ParamKind::Ptr { elem: #d, writable: #w })
            }
            ParamTy::Scalar(s) | ParamTy::Value(s) => {
                let d = dt(s);
                quote!(::dsl_runtime::__private::ir::ParamKind::Scalar(#d))
            }
        })
        .collect();
    // Its compile-time parameters, element types first-class among them (`T=bf16`), in
    // their order: the specialization in error messages and in the IR's text.
    let constants = k.order.iter().map(|g| match *g {
        GenParam::Type(i) => {
            let t = &k.types[i].name;
            let d = type_dtype(t);
            quote!((stringify!(#t), #d.name().to_string()))
        }
        GenParam::Const(i) => {
            let c = &k.consts[i].name;
            let v = const_local(c);
            quote!((stringify!(#c), #v.to_string()))
        }
        GenParam::Fn(i) => {
            let f = &k.fns[i];
            quote!((stringify!(#f), <#f as ::dsl_runtime::__private::dsl::KernelFn>::NAME.to_string()))
        }
    });
    // A kernel generic over element types or helpers holds them in a `PhantomData`; the
    // others are unit structs. Every kernel has `new()`.
    let (tnames, tdecl) = type_generics(k);
    let (strukt, new) = if tnames.is_empty() {
        (quote!(#vis struct #name #generics_decl;), quote!(Self))
    } else {
        (
            quote!(#vis struct #name #generics_decl { __elem: ::core::marker::PhantomData<fn() -> (#(#tnames,)*)> }),
            quote!(Self { __elem: ::core::marker::PhantomData }),
        )
    };
    // The hidden struct with the constants as values: it holds the IR builder and the
    // launch code, once for every value of the constants; `#name::<.., BLOCK>` is it with
    // the constants fixed, and `tune(..)` makes it from a configuration.
    let (cs, cs_t) = consts_struct(k);
    let nc = k.consts.len();
    let cs_decl = quote!(<#(#tdecl),*>);
    let cs_use = quote!(<#(#tnames),*>);
    let binds = bind_consts(k, quote!(self.consts));
    let consts_of_name = consts_array(k);
    let cs_doc = format!("`{name_str}` with its compile-time constants as values, in the order they are declared (what `{name_str}::<..>` and `{name_str}_tuned` build and launch).");
    let pstrs: Vec<String> = pnames.iter().map(|p| p.to_string()).collect();
    let arg_types: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| match &p.ty {
            ParamTy::Ptr(_) if lenient => quote!(impl ::core::marker::Sized),
            ParamTy::Ptr(e) => {
                let t = rust_type(e);
                if w { quote!(impl ::dsl_runtime::__private::launch::OutPtr<#t>) } else { quote!(impl ::dsl_runtime::__private::launch::InPtr<#t>) }
            }
            ParamTy::Scalar(s) | ParamTy::Value(s) => rust_type(s),
        })
        .collect();
    let binds_args: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| {
            let n = &p.name;
            match &p.ty {
                ParamTy::Ptr(e) => {
                    let t = rust_type(e);
                    if w {
                        quote!(::dsl_runtime::__private::launch::OutPtr::<#t>::bind(&mut #n, __stream, &mut __bind))
                    } else {
                        quote!(::dsl_runtime::__private::launch::InPtr::<#t>::bind(&#n, __stream, &mut __bind))
                    }
                }
                ParamTy::Scalar(_) | ParamTy::Value(_) => quote!(::dsl_runtime::__private::launch::ScalarArg::arg(#n)),
            }
        })
        .collect();
    let muts: Vec<TokenStream> = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| if w && matches!(p.ty, ParamTy::Ptr(_)) { quote!(mut) } else { quote!() })
        .collect();
    let param_bindings = pnames.iter().enumerate().map(|(i, n)| quote!(let #n = ::dsl_runtime::__private::ir::Operand::V(__b.param(#i));));
    let doc_sig = params
        .iter()
        .zip(&facts.writable)
        .map(|(p, &w)| match &p.ty {
            ParamTy::Ptr(e) => format!("`{}`: {} buffer of `{e}`", p.name, if w { "written" } else { "read" }),
            ParamTy::Scalar(s) | ParamTy::Value(s) => format!("`{}`: `{s}`", p.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let launch_doc = format!("Launch `{name_str}` with bounds-guarded accesses. Arguments: {doc_sig}.");
    let launch_body = if lenient {
        // Never compiled into a program: the kernel's errors stop the build.
        quote! {
            let _ = (kernel, launcher, cfg, safety, #(#pnames),*);
            ::core::unreachable!("the kernel has errors")
        }
    } else {
        quote! {
            let __stream = launcher.cuda_stream();
            let mut __bind = ::dsl_runtime::__private::launch::Bindings::default();
            let __args = [#(#binds_args),*];
            // SAFETY: `__args` come from the `InPtr`/`OutPtr` bindings of the buffers this
            // function borrows until it returns (writable ones `&mut`); `safety` is `Guarded`
            // from `launch`, or `Unchecked` from `launch_unchecked`, whose caller promised
            // that the kernel's masks stay inside the buffers.
            let __result = unsafe { launcher.launch_args(kernel, &cfg, &__args, safety) };
            drop(__bind);
            __result
        }
    };
    let launch_fns = |recv: TokenStream, kernel: TokenStream, launch_with: TokenStream| {
        quote! {
            #[doc = #launch_doc]
            ///
            /// Every access outside the buffers passed here is suppressed (loads give
            /// `other`, stores do nothing), so this is safe whatever the masks say.
            pub fn launch<L: ::dsl_runtime::__private::Launcher + ?Sized>(
                #recv
                launcher: &L,
                cfg: ::dsl_runtime::__private::LaunchConfig,
                #(#pnames: #arg_types),*
            ) -> ::dsl_runtime::__private::Result<()> {
                // SAFETY: a guarded launch needs nothing of its caller.
                unsafe { #launch_with(#kernel, launcher, cfg, ::dsl_runtime::__private::launch::Safety::Guarded, #(#pnames),*) }
            }

            /// Launch without bounds guards: accesses are limited only by the kernel's masks.
            ///
            /// # Safety
            ///
            /// Every lane whose mask is true must address an element inside the buffer its
            /// pointer derives from. The CPU interpreter checks this and reports violations.
            pub unsafe fn launch_unchecked<L: ::dsl_runtime::__private::Launcher + ?Sized>(
                #recv
                launcher: &L,
                cfg: ::dsl_runtime::__private::LaunchConfig,
                #(#pnames: #arg_types),*
            ) -> ::dsl_runtime::__private::Result<()> {
                // SAFETY: this function's caller upholds the contract above.
                unsafe { #launch_with(#kernel, launcher, cfg, ::dsl_runtime::__private::launch::Safety::Unchecked, #(#pnames),*) }
            }
        }
    };
    let name_launch = launch_fns(quote!(), quote!(&Self::new()), quote!(#cs #cs_t::__launch));
    let launch_as_doc = format!("Launch `kernel`, a kernel built from `{name_str}` at run time (`IrKernel::hooked`), with `{name_str}`'s typed arguments and bounds-guarded accesses. The arguments are checked against `kernel`'s parameters, as every launch's are.");
    // A stub where the kernel has errors (never compiled into a program: they stop the
    // build), so that a call of it adds no error of its own.
    let launch_as_body = if lenient {
        quote! {
            let _ = (kernel, launcher, cfg, #(#pnames),*);
            ::core::unreachable!("the kernel has errors")
        }
    } else {
        quote! {
            // SAFETY: a guarded launch needs nothing of its caller, whatever the kernel
            // (its parameters are checked against the arguments at the launch).
            unsafe { #cs #cs_t::__launch(kernel, launcher, cfg, ::dsl_runtime::__private::launch::Safety::Guarded, #(#pnames),*) }
        }
    };
    let launch_as = quote! {
        #[doc = #launch_as_doc]
        pub fn launch_as<L: ::dsl_runtime::__private::Launcher + ?Sized>(
            kernel: &dyn ::dsl_runtime::__private::Kernel,
            launcher: &L,
            cfg: ::dsl_runtime::__private::LaunchConfig,
            #(#pnames: #arg_types),*
        ) -> ::dsl_runtime::__private::Result<()> {
            #launch_as_body
        }
    };
    let cs_launch = launch_fns(quote!(&self,), quote!(self), quote!(Self::__launch));
    quote! {
        #(#attrs)*
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, Default)]
        #strukt

        #[doc = #cs_doc]
        #[doc(hidden)]
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug)]
        #vis struct #cs #cs_decl {
            consts: [i64; #nc],
            __elem: ::core::marker::PhantomData<fn() -> (#(#tnames,)*)>,
        }

        #[allow(clippy::too_many_arguments)]
        impl #cs_decl #cs #cs_use {
            /// Name, source and parameters, one per instantiation (its element types are in
            /// its parameters).
            #[doc(hidden)]
            const __META: &'static ::dsl_runtime::__private::launch::KernelMeta = &::dsl_runtime::__private::launch::KernelMeta {
                name: ::std::borrow::Cow::Borrowed(#name_str),
                file: ::std::borrow::Cow::Borrowed(file!()),
                line: #line,
                params: ::std::borrow::Cow::Borrowed(&[#((::std::borrow::Cow::Borrowed(#pstrs), #pkinds)),*]),
            };

            /// The kernel with these values of its constants.
            pub const fn new(consts: [i64; #nc]) -> Self {
                Self { consts, __elem: ::core::marker::PhantomData }
            }

            #cs_launch

            /// # Safety
            ///
            /// `safety` is `Guarded`, or the contract of `launch_unchecked` holds.
            #[doc(hidden)]
            pub unsafe fn __launch<L: ::dsl_runtime::__private::Launcher + ?Sized>(
                kernel: &dyn ::dsl_runtime::__private::Kernel,
                launcher: &L,
                cfg: ::dsl_runtime::__private::LaunchConfig,
                safety: ::dsl_runtime::__private::launch::Safety,
                #(#muts #pnames: #arg_types),*
            ) -> ::dsl_runtime::__private::Result<()> {
                #launch_body
            }
        }

        impl #cs_decl ::dsl_runtime::__private::Kernel for #cs #cs_use {
            fn meta(&self) -> &::dsl_runtime::__private::launch::KernelMeta {
                Self::__META
            }
            fn id(&self) -> ::dsl_runtime::__private::launch::KernelId {
                ::dsl_runtime::__private::launch::kernel_id_of::<Self>(&self.consts)
            }
            #[allow(unused_variables, non_snake_case)]
            fn constants(&self) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                #(#binds)*
                ::std::vec![#(#constants),*]
            }
            #[allow(unused_variables, unused_mut, unused_parens, non_snake_case, clippy::all)]
            fn build(&self, __b: &mut ::dsl_runtime::__private::ir::Builder) -> ::std::result::Result<(), ::dsl_runtime::__private::BuildError> {
                #(#binds)*
                #(#param_bindings)*
                #body
                Ok(())
            }
        }

        #[allow(clippy::too_many_arguments)]
        impl #generics_decl #name #generics_use {
            /// The kernel, as a value (`Box::new(k::<..>::new())` for a `Box<dyn Kernel>`).
            pub const fn new() -> Self {
                #new
            }

            /// This instantiation with its constants as values.
            #[doc(hidden)]
            pub const fn __with_consts() -> #cs #cs_use {
                #cs::new(#consts_of_name)
            }

            #name_launch

            #launch_as
        }

        impl #generics_decl ::dsl_runtime::__private::Kernel for #name #generics_use {
            fn meta(&self) -> &::dsl_runtime::__private::launch::KernelMeta {
                #cs #cs_t::__META
            }
            fn id(&self) -> ::dsl_runtime::__private::launch::KernelId {
                ::dsl_runtime::__private::launch::kernel_id_of::<#cs #cs_use>(&#consts_of_name)
            }
            fn constants(&self) -> ::std::vec::Vec<(&'static str, ::std::string::String)> {
                Self::__with_consts().constants()
            }
            fn build(&self, __b: &mut ::dsl_runtime::__private::ir::Builder) -> ::std::result::Result<(), ::dsl_runtime::__private::BuildError> {
                Self::__with_consts().build(__b)
            }
        }
    }
}

struct Gen<'f> {
    consts: HashSet<String>,
    /// Helper type parameters (`S: KernelFn`), called as `S(..)`.
    fns: HashSet<String>,
    /// Element type parameters: the Rust expression of each one's `DType`.
    dtypes: HashMap<String, TokenStream>,
    next: usize,
    facts: &'f Facts,
}

/// The call of a helper as rustc sees it: `callee(__arg0, ..)`, each argument a
/// variable named at the argument's first token and the parentheses spanned to the end of
/// the call, so that rustc's errors (no such function, a wrong number of arguments, a Rust
/// function) underline the call as written. Returns the argument variables and the call.
fn helper_call_expr(func: &syn::Ident, path: Option<&syn::Path>, args: &[Expr], span: Sp) -> (Vec<syn::Ident>, TokenStream) {
    let names: Vec<syn::Ident> = args.iter().enumerate().map(|(i, a)| syn::Ident::new(&format!("__arg{i}"), a.span().start)).collect();
    let callee = match path {
        Some(p) => {
            let colon = p.leading_colon;
            let segs = p.segments.iter().map(|s| &s.ident);
            quote!(#colon #(#segs)::*)
        }
        None => quote!(#func),
    };
    let mut parens = proc_macro2::Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#(#names),*));
    parens.set_span(span.end);
    (names, quote!(#callee #parens))
}

/// The constants a helper call passes, `[BM as i64, ..]` as written in its turbofish
/// (`helper::<BM, BN>(..)`), spanned at the call: a wrong number of them is rustc's
/// "expected an array with a size of N" there.
fn helper_consts(generics: &[Generic], span: Sp, consts: &HashSet<String>) -> TokenStream {
    let gs = generics.iter().map(|g| {
        let e = match g {
            Generic::Type(n, s) => syn::Ident::new(n, s.start).into_token_stream(),
            Generic::Const(e) => e.into_token_stream(),
        };
        let e = with_const_locals(e, consts);
        quote!((#e) as i64)
    });
    let mut array = proc_macro2::Group::new(proc_macro2::Delimiter::Bracket, quote!(#(#gs),*));
    array.set_span(span.start);
    array.into_token_stream()
}

/// Every helper call in `b` (in nested blocks too) but those of `this` by its name, each as
/// a block that makes the call on placeholder arguments:
/// `{ let __arg0 = Operand::Int(0); .. ; callee(__arg0, ..) }`.
fn helper_calls(b: &Block, this: &syn::Ident) -> Vec<TokenStream> {
    fn block(b: &Block, this: &syn::Ident, out: &mut Vec<TokenStream>) {
        for s in &b.stmts {
            match s {
                Stmt::Let { init: e, .. } | Stmt::Assign { value: e, .. } | Stmt::Expr(e) => expr(e, this, out),
            }
        }
        if let Some(t) = &b.tail {
            expr(t, this, out);
        }
    }
    fn expr(e: &Expr, this: &syn::Ident, out: &mut Vec<TokenStream>) {
        match e {
            Expr::Binary { lhs, rhs, .. } => {
                expr(lhs, this, out);
                expr(rhs, this, out);
            }
            Expr::Neg(x, _) | Expr::Not(x, _) | Expr::Cast { expr: x, .. } => expr(x, this, out),
            Expr::Array(xs, _) => xs.iter().for_each(|x| expr(x, this, out)),
            Expr::Call { func, path, args, method, span, .. } => {
                args.iter().for_each(|x| expr(x, this, out));
                let own = path.is_none() && func == this;
                if !*method && !own && (path.is_some() || builtins::lookup(&func.to_string()).is_none()) {
                    let (names, call) = helper_call_expr(func, path.as_deref(), args, *span);
                    let zero = quote!(::dsl_runtime::__private::ir::Operand::Int(0));
                    out.push(quote!({ #(let #names: ::dsl_runtime::__private::ir::Operand = #zero;)* #call }));
                }
            }
            Expr::If { cond_dsl, then, els, .. } => {
                if let Some(c) = cond_dsl {
                    expr(c, this, out);
                }
                block(then, this, out);
                if let Some(b) = els {
                    block(b, this, out);
                }
            }
            Expr::For { start, end, step, body, .. } => {
                expr(start, this, out);
                expr(end, this, out);
                if let Some(s) = step {
                    expr(s, this, out);
                }
                block(body, this, out);
            }
            Expr::Block(b, _) => block(b, this, out),
            _ => {}
        }
    }
    let mut out = vec![];
    block(b, this, &mut out);
    out
}

/// Variables declared outside `b` that `b` assigns (in order of first assignment): the
/// values a loop carries or a branch gives back.
fn assigned_outside(b: &Block, inner: &mut Vec<String>, out: &mut Vec<syn::Ident>) {
    let depth = inner.len();
    for s in &b.stmts {
        match s {
            Stmt::Let { name, init, .. } => {
                assigned_in_expr(init, inner, out);
                inner.push(name.to_string());
            }
            Stmt::Assign { name, value, .. } => {
                assigned_in_expr(value, inner, out);
                if !inner.contains(&name.to_string()) && !out.contains(name) {
                    out.push(name.clone());
                }
            }
            Stmt::Expr(e) => assigned_in_expr(e, inner, out),
        }
    }
    if let Some(t) = &b.tail {
        assigned_in_expr(t, inner, out);
    }
    inner.truncate(depth);
}

fn assigned_in_expr(e: &Expr, inner: &mut Vec<String>, out: &mut Vec<syn::Ident>) {
    match e {
        Expr::Binary { lhs, rhs, .. } => {
            assigned_in_expr(lhs, inner, out);
            assigned_in_expr(rhs, inner, out);
        }
        Expr::Neg(x, _) | Expr::Not(x, _) | Expr::Cast { expr: x, .. } => assigned_in_expr(x, inner, out),
        Expr::Call { args, .. } | Expr::Array(args, _) => args.iter().for_each(|a| assigned_in_expr(a, inner, out)),
        Expr::If { then, els, .. } => {
            assigned_outside(then, inner, out);
            if let Some(b) = els {
                assigned_outside(b, inner, out);
            }
        }
        Expr::For { var, body, .. } => {
            inner.push(var.to_string());
            assigned_outside(body, inner, out);
            inner.pop();
        }
        Expr::Block(b, _) => assigned_outside(b, inner, out),
        _ => {}
    }
}

fn carried(blocks: &[&Block]) -> Vec<syn::Ident> {
    let mut out = vec![];
    for b in blocks {
        assigned_outside(b, &mut vec![], &mut out);
    }
    out
}

fn loc(span: Sp) -> TokenStream {
    let span = span.start;
    quote_spanned!(span=> ::dsl_runtime::__private::ir::Loc::in_file(file!(), line!(), column!()))
}

/// `::dsl_runtime::__private::ir::<path>`: an op of the runtime, such as `UnaryOp::Exp`.
fn ir_op(path: &str) -> TokenStream {
    let path: TokenStream = path.parse().expect("a path");
    quote!(::dsl_runtime::__private::ir::#path)
}

/// An `i64` literal (a negative one as `-` and a literal, as Rust writes it).
fn i64_lit(v: i64) -> TokenStream {
    let l = Literal::i64_suffixed(v.unsigned_abs() as i64);
    if v < 0 {
        quote!(-#l)
    } else {
        quote!(#l)
    }
}

const UNIT: fn() -> TokenStream = || quote!(::dsl_runtime::__private::ir::Operand::Bool(false));

impl Gen<'_> {
    fn new<'f>(k: &Kernel, facts: &'f Facts, dtypes: HashMap<String, TokenStream>) -> Gen<'f> {
        Gen { consts: k.consts.iter().map(|c| c.name.to_string()).collect(), fns: k.fns.iter().map(|f| f.to_string()).collect(), dtypes, next: 0, facts }
    }

    /// An element type as a `DType` expression (a type parameter's, or a constant).
    fn dtype(&self, d: &str) -> TokenStream {
        self.dtypes.get(d).cloned().unwrap_or_else(|| dtype_tokens(d))
    }

    fn tmp(&mut self) -> syn::Ident {
        self.next += 1;
        format_ident!("__t{}", self.next)
    }

    fn body(&mut self, b: &Block) -> TokenStream {
        let mut out = vec![];
        self.block_into(b, &mut out);
        quote!(#(#out)*)
    }

    /// Emit a block's statements into `out`; return its tail value (an `Operand`).
    fn block_into(&mut self, b: &Block, out: &mut Vec<TokenStream>) -> TokenStream {
        for s in &b.stmts {
            match s {
                Stmt::Let { name, mutable, init } => {
                    let v = self.expr(init, out);
                    let m = if *mutable { quote!(mut) } else { quote!() };
                    out.push(quote!(let #m #name: ::dsl_runtime::__private::ir::Operand = #v;));
                }
                Stmt::Assign { name, op, value, span } => {
                    let v = self.expr(value, out);
                    let v = match op {
                        Some(op) => self.binary(*op, quote!(#name), v, *span, out),
                        None => v,
                    };
                    out.push(quote!(#name = #v;));
                }
                Stmt::Expr(e) => {
                    self.expr(e, out);
                }
            }
        }
        match &b.tail {
            Some(e) => self.expr(e, out),
            None => UNIT(),
        }
    }

    fn binary(&mut self, op: Bin, l: TokenStream, r: TokenStream, span: Sp, out: &mut Vec<TokenStream>) -> TokenStream {
        let t = self.tmp();
        let (path, method) = op.ir_path();
        let (o, f, lc) = (ir_op(&path), format_ident!("{}", method), loc(span));
        out.push(quote!(let #t = __b.#f(#o, #l, #r, #lc)?;));
        quote!(::dsl_runtime::__private::ir::Operand::V(#t))
    }

    fn call(&mut self, f: TokenStream, args: Vec<TokenStream>, span: Sp, out: &mut Vec<TokenStream>) -> TokenStream {
        let t = self.tmp();
        let lc = loc(span);
        out.push(quote!(let #t = __b.#f(#(#args,)* #lc)?;));
        quote!(::dsl_runtime::__private::ir::Operand::V(#t))
    }

    /// A compile-time expression as Rust `i64`.
    fn const_i64(&self, e: &Expr) -> TokenStream {
        match e {
            Expr::Int(i, _) => {
                let l = Literal::i64_suffixed(*i);
                quote!(#l)
            }
            Expr::Var(i) => {
                let i = self.local(i);
                quote!((#i as i64))
            }
            Expr::Neg(x, _) => {
                let x = self.const_i64(x);
                quote!((-#x))
            }
            Expr::Binary { op, lhs, rhs, .. } if !op.is_cmp() => {
                let (l, r) = (self.const_i64(lhs), self.const_i64(rhs));
                let o: TokenStream = op.symbol().parse().unwrap();
                quote!((#l #o #r))
            }
            Expr::Cast { expr, .. } => self.const_i64(expr),
            other => {
                let msg = "expected a compile-time integer expression (literals, const generics, + - * / %)";
                syn::Error::new_spanned(other.span(), msg).to_compile_error()
            }
        }
    }

    fn generic_i64(&self, g: &Generic) -> TokenStream {
        match g {
            Generic::Type(n, span) => {
                let i = self.local(&syn::Ident::new(n, span.start));
                quote!((#i as i64))
            }
            Generic::Const(e) => {
                let e = with_const_locals(quote!(#e), &self.consts);
                quote!(((#e) as i64))
            }
        }
    }

    /// A name as the builder's Rust sees it: a constant's [`const_local`], others as written.
    fn local(&self, i: &syn::Ident) -> syn::Ident {
        if self.consts.contains(&i.to_string()) { const_local(i) } else { i.clone() }
    }

    fn expr(&mut self, e: &Expr, out: &mut Vec<TokenStream>) -> TokenStream {
        match e {
            Expr::Int(i, _) => {
                let l = Literal::i64_suffixed(*i);
                quote!(::dsl_runtime::__private::ir::Operand::Int(#l))
            }
            Expr::Float(x, _) => {
                let l = if x.is_nan() {
                    quote!(::core::f64::NAN)
                } else if x.is_infinite() {
                    if *x > 0.0 { quote!(::core::f64::INFINITY) } else { quote!(::core::f64::NEG_INFINITY) }
                } else {
                    let l = Literal::f64_suffixed(*x);
                    quote!(#l)
                };
                quote!(::dsl_runtime::__private::ir::Operand::Float(#l))
            }
            Expr::Bool(b, _) => quote!(::dsl_runtime::__private::ir::Operand::Bool(#b)),
            Expr::Var(i) if self.consts.contains(&i.to_string()) => {
                // A `bool` constant stays a bool; integers widen to i64.
                let i = const_local(i);
                quote!(::dsl_runtime::__private::ir::Operand::from_const(#i))
            }
            Expr::Var(i) => quote!(#i),
            Expr::Binary { op, lhs, rhs, span } => {
                let (l, r) = (self.expr(lhs, out), self.expr(rhs, out));
                self.binary(*op, l, r, *span, out)
            }
            Expr::Neg(x, span) => {
                let x = self.expr(x, out);
                self.call(quote!(unary), vec![quote!(::dsl_runtime::__private::ir::UnaryOp::Neg), x], *span, out)
            }
            Expr::Not(x, span) => {
                let x = self.expr(x, out);
                self.call(quote!(unary), vec![quote!(::dsl_runtime::__private::ir::UnaryOp::Not), x], *span, out)
            }
            Expr::Cast { expr, ty, span, .. } => {
                let x = self.expr(expr, out);
                let d = self.dtype(ty);
                self.call(quote!(cast), vec![x, d], *span, out)
            }
            Expr::If { cond, cond_dsl, then, els, span, .. } => {
                if let (Some(&has_value), Some(c)) = (self.facts.runtime.get(&validate::node(e)), cond_dsl) {
                    return self.runtime_if(c, then, els.as_ref(), has_value, *span, out);
                }
                let t = self.tmp();
                let mut a = vec![];
                let va = self.block_into(then, &mut a);
                let mut b = vec![];
                let vb = match els {
                    Some(e) => self.block_into(e, &mut b),
                    None => UNIT(),
                };
                let cond = with_const_locals(quote!(#cond), &self.consts);
                out.push(quote!(let #t: ::dsl_runtime::__private::ir::Operand = if #cond { #(#a)* #va } else { #(#b)* #vb };));
                quote!(#t)
            }
            Expr::For { var, start, end, step, body, span } => {
                let runtime = self.facts.runtime.contains_key(&validate::node(e));
                self.for_loop(var, start, end, step.as_deref(), body, runtime, *span, out);
                UNIT()
            }
            Expr::Return(span) => {
                let lc = loc(*span);
                out.push(quote!(__b.ret(#lc)?;));
                UNIT()
            }
            Expr::Str(..) | Expr::Array(..) => UNIT(), // only as builtin arguments
            Expr::Block(b, _) => {
                let t = self.tmp();
                let mut a = vec![];
                let v = self.block_into(b, &mut a);
                out.push(quote!(let #t: ::dsl_runtime::__private::ir::Operand = { #(#a)* #v };));
                quote!(#t)
            }
            Expr::Call { func, path, generics, args, span, .. } => match builtins::lookup(&func.to_string()) {
                Some(b) if path.is_none() => self.builtin(b, generics, args, *span, out),
                _ => self.helper_call(func, path.as_deref(), generics, args, *span, out),
            },
            Expr::Error(_) => UNIT(), // unreachable: errors stop the expansion of the body
        }
    }

    /// A runtime `if`: each branch starts from the values before the `if`; the variables
    /// either branch assigns (and the `if`'s value) come back as results.
    fn runtime_if(&mut self, c: &Expr, then: &Block, els: Option<&Block>, has_value: bool, span: Sp, out: &mut Vec<TokenStream>) -> TokenStream {
        let blocks: Vec<&Block> = [Some(then), els].into_iter().flatten().collect();
        let vars = carried(&blocks);
        let names: Vec<String> = vars.iter().map(|v| v.to_string()).chain(has_value.then(|| "the value of the `if`".to_string())).collect();
        let cv = self.expr(c, out);
        let lc = loc(span);
        let (saved, results) = (self.tmp(), self.tmp());
        let nv = vars.len();
        let nt = nv + has_value as usize;
        out.push(quote!(__b.begin_if(#cv, #lc)?; let #saved: [::dsl_runtime::__private::ir::Operand; #nv] = [#(#vars),*];));
        let mut a = vec![];
        let va = self.block_into(then, &mut a);
        let ta: Vec<TokenStream> = vars.iter().map(|v| quote!(#v)).chain(has_value.then_some(va)).collect();
        let then_vals = self.tmp();
        out.push(quote!(let #then_vals: [::dsl_runtime::__private::ir::Operand; #nt] = { #(#a)* [#(#ta),*] };));
        let restore = vars.iter().enumerate().map(|(i, v)| quote!(#v = #saved[#i];));
        out.push(quote!(#(#restore)* __b.begin_else(&#then_vals, #lc)?;));
        let mut b = vec![];
        let vb = match els {
            Some(e) => self.block_into(e, &mut b),
            None => UNIT(),
        };
        let tb: Vec<TokenStream> = vars.iter().map(|v| quote!(#v)).chain(has_value.then_some(vb)).collect();
        out.push(quote!(let #results = { #(#b)* let __v: [::dsl_runtime::__private::ir::Operand; #nt] = [#(#tb),*]; __b.end_if(&__v, &[#(#names),*], #lc)? };));
        let assign = vars.iter().enumerate().map(|(i, v)| quote!(#v = #results[#i];));
        out.push(quote!(#(#assign)*));
        let k = vars.len();
        if has_value { quote!(#results[#k]) } else { UNIT() }
    }

    #[allow(clippy::too_many_arguments)]
    fn for_loop(&mut self, var: &syn::Ident, start: &Expr, end: &Expr, step: Option<&Expr>, body: &Block, runtime: bool, span: Sp, out: &mut Vec<TokenStream>) {
        let lc = loc(span);
        if !runtime {
            // A compile-time range: unrolled while the IR is built.
            let (s, e) = (self.const_i64(start), self.const_i64(end));
            let st = step.map(|x| self.const_i64(x)).unwrap_or(quote!(1i64));
            let mut a = vec![];
            let v = self.block_into(body, &mut a);
            out.push(quote!(for __k in (#s..#e).step_by(::core::cmp::max(#st, 1) as usize) { let #var = ::dsl_runtime::__private::ir::Operand::Int(__k); #(#a)* let _ = #v; }));
            return;
        }
        let vars = carried(&[body]);
        let names: Vec<String> = vars.iter().map(|v| v.to_string()).collect();
        let (s, e) = (self.expr(start, out), self.expr(end, out));
        let st = match step {
            Some(x) => self.expr(x, out),
            None => quote!(::dsl_runtime::__private::ir::Operand::Int(1)),
        };
        let (iv, args, results) = (self.tmp(), self.tmp(), self.tmp());
        out.push(quote!(let (#iv, #args) = __b.begin_for(#s, #e, #st, &[#(#vars),*], #lc)?;));
        let bind = vars.iter().enumerate().map(|(i, v)| quote!(#v = #args[#i];));
        out.push(quote!(#(#bind)*));
        let mut a = vec![];
        self.block_into(body, &mut a);
        out.push(quote!({ let #var = #iv; #(#a)* }));
        out.push(quote!(let #results = __b.end_for(&[#(#vars),*], &[#(#names),*], #lc)?;));
        let assign = vars.iter().enumerate().map(|(i, v)| quote!(#v = #results[#i];));
        out.push(quote!(#(#assign)*));
    }

    /// `[a, b, ..]` as a Rust `[i64; N]`.
    fn shape_i64(&self, e: &Expr) -> TokenStream {
        match e {
            Expr::Array(items, _) => {
                let xs = items.iter().map(|i| self.const_i64(i));
                quote!([#(#xs),*])
            }
            other => self.const_i64(other),
        }
    }

    /// The call of a `#[kernel_fn]`: `inline_with(helper(args..), [G..], __b, loc)`, the helper's
    /// name and each argument (a variable named at the argument's first token) spanned as
    /// written, so that rustc's errors (no such function, wrong number of arguments, a Rust
    /// function) point at the call.
    fn helper_call(&mut self, func: &syn::Ident, path: Option<&syn::Path>, generics: &[Generic], args: &[Expr], span: Sp, out: &mut Vec<TokenStream>) -> TokenStream {
        let vals: Vec<TokenStream> = args.iter().map(|a| self.expr(a, out)).collect();
        if path.is_none() && self.fns.contains(&func.to_string()) {
            // `S(..)` of a helper type parameter: the helper given for `S`, its arity checked
            // when the kernel is compiled for it (the constant is spanned at the call).
            let t = self.tmp();
            let lc = loc(span);
            let start = span.start;
            let call = quote_spanned!(start=> ::dsl_runtime::__private::dsl::inlining::inline_fn::<#func, _>([#(#vals),*], __b, #lc));
            out.push(quote!(let #t: ::dsl_runtime::__private::ir::Operand = #call?;));
            return quote!(#t);
        }
        let (names, call) = helper_call_expr(func, path, args, span);
        let t = self.tmp();
        let lc = loc(span);
        // At the call, so that rustc's "required by a bound introduced by this call" (a
        // Rust function where a helper was meant) points there.
        let start = span.start;
        let inline = quote_spanned!(start=> ::dsl_runtime::__private::dsl::inlining::inline_with);
        let consts = helper_consts(generics, span, &self.consts);
        out.push(quote!(let #t: ::dsl_runtime::__private::ir::Operand = { #(let #names: ::dsl_runtime::__private::ir::Operand = #vals;)* #inline(#call, #consts, __b, #lc)? };));
        quote!(#t)
    }

    /// A builtin call, as its row of the table says: its arguments by their [`Arg`]s
    /// (operands emitted left to right), then its [`Build`].
    fn builtin(&mut self, b: &builtins::Builtin, generics: &[Generic], args: &[Expr], span: Sp, out: &mut Vec<TokenStream>) -> TokenStream {
        let vals: Vec<TokenStream> = match (b.generics, generics) {
            // `arange::<N>()` is `arange(0, N)`.
            (Generics::Length, [g]) => vec![quote!(0i64), self.generic_i64(g)],
            _ => args.iter().enumerate().map(|(i, a)| self.arg(b.arg(i), a, out)).collect(),
        };
        let (method, srcs) = match b.build {
            Build::Call { method, args } => (method, args),
            Build::Operator => {
                let Rule::Operator(op) = b.rule else { unreachable!("`Build::Operator` goes with `Rule::Operator`") };
                return self.binary(op, vals[0].clone(), vals[1].clone(), span, out);
            }
        };
        let none = quote!(::core::option::Option::None);
        let mut built: Vec<TokenStream> = vec![];
        for src in srcs {
            let t = match *src {
                Src::Op(path) => ir_op(path),
                Src::Arg(i) => vals[i].clone(),
                Src::Opt(i) => match vals.get(i) {
                    Some(v) => quote!(::core::option::Option::Some(#v)),
                    None => none.clone(),
                },
                Src::Or(i, default) => vals.get(i).cloned().unwrap_or_else(|| i64_lit(default)),
                Src::Rest(i) => {
                    let rest = vals.get(i..).unwrap_or_default();
                    quote!(&[#(#rest),*])
                }
                Src::I64(v) => i64_lit(v),
                Src::Zero => quote!(::dsl_runtime::__private::ir::Operand::Int(0)),
                Src::None => none.clone(),
                Src::Dtype(k) => match generics {
                    [Generic::Type(t, _)] => self.dtype(t),
                    _ => {
                        let v = &built[k];
                        quote!(::dsl_runtime::__private::ir::Builder::dtype_of_operand(__b, #v))
                    }
                },
            };
            built.push(t);
        }
        let f = format_ident!("{}", method);
        if b.rule.gives_unit() {
            let lc = loc(span);
            out.push(quote!(__b.#f(#(#built,)* #lc)?;));
            UNIT()
        } else {
            self.call(quote!(#f), built, span, out)
        }
    }

    /// One argument of a builtin, as its [`Arg`] makes it: an `Operand` (emitting what
    /// computes it), an `i64`, a shape `&[i64; N]` or a `&str`.
    fn arg(&mut self, role: Arg, a: &Expr, out: &mut Vec<TokenStream>) -> TokenStream {
        match role {
            Arg::Const(_) => self.const_i64(a),
            Arg::Shape => {
                let shape = self.shape_i64(a);
                quote!(&#shape)
            }
            Arg::Str => match a {
                Expr::Str(s, _) => quote!(#s),
                _ => quote!(""),
            },
            Arg::Value | Arg::Ptr | Arg::Mask | Arg::Cond | Arg::Values => self.expr(a, out),
        }
    }
}
