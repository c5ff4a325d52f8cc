//! How a function's error reaches Lambda: a short stable name (the error type in the Lambda
//! response, logs and metrics) beside the message.
//!
//! Each function's error enum implements [`FunctionError`]; its `From<…> for Diagnostic` is the
//! one line that calls [`diagnostic`] (the orphan rule forbids one blanket impl for all).

/// An error a function's invocation can end with.
pub trait FunctionError: std::error::Error {
    /// A short, stable name of the variant (`ClusterAccessFailed`, `RecordsFailed`, ...): the
    /// label in logs and metrics.
    fn kind(&self) -> &'static str;

    /// The Lambda error type: the kind, unless the function namespaces it.
    fn error_type(&self) -> String {
        self.kind().to_owned()
    }
}

/// The Lambda response for `error`: its type and its message (the whole chain, as `Display`
/// gives it).
pub fn diagnostic(error: &impl FunctionError) -> lambda_runtime::Diagnostic {
    lambda_runtime::Diagnostic {
        error_type: error.error_type(),
        error_message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Plain {
        #[error("it broke: {0}")]
        Broke(&'static str),
    }

    impl FunctionError for Plain {
        fn kind(&self) -> &'static str {
            "Broke"
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("namespaced")]
    struct Namespaced;

    impl FunctionError for Namespaced {
        fn kind(&self) -> &'static str {
            "Inner"
        }
        fn error_type(&self) -> String {
            format!("Function.{}", self.kind())
        }
    }

    #[test]
    fn the_diagnostic_carries_the_kind_and_the_message() {
        let d = diagnostic(&Plain::Broke("disk"));
        assert_eq!(d.error_type, "Broke");
        assert_eq!(d.error_message, "it broke: disk");
    }

    #[test]
    fn a_function_may_namespace_its_error_type() {
        let d = diagnostic(&Namespaced);
        assert_eq!(d.error_type, "Function.Inner");
        assert_eq!(d.error_message, "namespaced");
    }
}
