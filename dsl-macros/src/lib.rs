use proc_macro::TokenStream;
#[proc_macro_attribute]
pub fn kernel(_a: TokenStream, item: TokenStream) -> TokenStream { item }
