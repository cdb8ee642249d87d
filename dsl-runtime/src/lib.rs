pub mod dtype;
pub mod error;
pub mod ir;
pub use dtype::{DType, Element};
pub use error::{BuildError, Error, Result};
pub mod layout;
pub mod passes;
