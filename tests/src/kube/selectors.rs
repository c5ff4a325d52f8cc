//! Label selectors as the API server understands them.
//!
//! Two inputs lead to the same [`LabelQuery`]:
//! - the `labelSelector` query parameter of a list/watch (`app=web,tier!=db,env in (a,b),!legacy`),
//!   parsed with the grammar and the error messages of apimachinery's `labels.Parse`;
//! - a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`), as a PDB,
//!   ReplicaSet or DaemonSet carries it, converted like `metav1.LabelSelectorAsSelector`:
//!   an empty selector selects everything, an absent one selects nothing.
//!
//! Pure functions only: the fake API server decides what to do with an error (a 400).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

/// Why a selector was rejected. Every variant is a client error: the API server answers
/// `400 BadRequest` with [`SelectorError::to_string`] as the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The query string does not follow the selector grammar (a misplaced comma, a missing
    /// parenthesis, an unknown operator). The message names what was found and expected.
    #[error("{message}")]
    Syntax { message: String },
    /// The grammar is fine but a key, a value, an operator or the number of values is not
    /// allowed (e.g. `a b=c`, `in ()` from a `LabelSelector` with no values).
    #[error("{message}")]
    InvalidRequirement { message: String },
}

impl SelectorError {
    fn syntax(message: impl Into<String>) -> Self {
        Self::Syntax {
            message: message.into(),
        }
    }

    /// Errors raised while parsing one requirement carry apimachinery's prefix.
    fn in_requirement(self) -> Self {
        match self {
            Self::Syntax { message } => Self::Syntax {
                message: format!("unable to parse requirement: {message}"),
            },
            Self::InvalidRequirement { message } => Self::InvalidRequirement {
                message: format!("unable to parse requirement: {message}"),
            },
        }
    }
}

/// How a requirement relates a label key to its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    /// `a=b`
    Equals,
    /// `a==b` (same meaning as `=`, kept to print the selector back as written)
    DoubleEquals,
    /// `a!=b`: also true when the label is absent.
    NotEquals,
    /// `a`
    Exists,
    /// `!a`
    DoesNotExist,
    /// `a>3`: the label must be an integer greater than the value.
    GreaterThan,
    /// `a<3`
    LessThan,
}

impl Operator {
    /// The spelling apimachinery's `selection.Operator` uses in messages.
    fn as_str(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::NotIn => "notin",
            Self::Equals => "=",
            Self::DoubleEquals => "==",
            Self::NotEquals => "!=",
            Self::Exists => "exists",
            Self::DoesNotExist => "!",
            Self::GreaterThan => "gt",
            Self::LessThan => "lt",
        }
    }
}

/// One condition on one label key. All requirements of a [`LabelQuery`] must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    operator: Operator,
    /// Sorted and deduplicated, as apimachinery keeps them (a set).
    values: Vec<String>,
}

impl Requirement {
    /// Validates like apimachinery's `NewRequirement`: key syntax, the number of values for
    /// the operator, integer values for `gt`/`lt`, and the syntax of each value.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: Vec<String>,
    ) -> Result<Self, SelectorError> {
        let key = key.into();
        let mut problems = Vec::new();
        if let Err(detail) = validate_label_key(&key) {
            problems.push(format!("key: Invalid value: {key:?}: {detail}"));
        }
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => problems.push(format!(
                "values: Invalid value: {}: for 'in', 'notin' operators, values set can't be empty",
                go_string_slice(&values)
            )),
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                problems.push(format!(
                    "values: Invalid value: {}: exact-match compatibility requires one single value",
                    go_string_slice(&values)
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                problems.push(format!(
                    "values: Invalid value: {}: values set must be empty for exists and does not exist",
                    go_string_slice(&values)
                ));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    problems.push(format!(
                        "values: Invalid value: {}: for 'Gt', 'Lt' operators, exactly one value is required",
                        go_string_slice(&values)
                    ));
                }
                for (index, value) in values.iter().enumerate() {
                    if value.parse::<i64>().is_err() {
                        problems.push(format!(
                            "values[{index}]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                        ));
                    }
                }
            }
            _ => {}
        }
        for (index, value) in values.iter().enumerate() {
            if let Err(detail) = validate_label_value(value) {
                problems.push(format!(
                    "values[{index}][{key}]: Invalid value: {value:?}: {detail}"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(SelectorError::InvalidRequirement {
                message: aggregate(&problems),
            });
        }
        let mut values = values;
        values.sort();
        values.dedup();
        Ok(Self {
            key,
            operator,
            values,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a set of labels satisfies this requirement. Note that `!=` and `notin` hold
    /// for objects that do not carry the label at all, exactly as in Kubernetes.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }

    /// [`Requirement::matches`] given the object's value of the key (`None`: no such label).
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match self.operator {
            Operator::In | Operator::Equals | Operator::DoubleEquals => {
                value.is_some_and(|v| self.values.iter().any(|wanted| wanted == v))
            }
            Operator::NotIn | Operator::NotEquals => {
                value.is_none_or(|v| !self.values.iter().any(|wanted| wanted == v))
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(actual), [bound]) = (value, self.values.as_slice()) else {
                    return false;
                };
                let (Ok(actual), Ok(bound)) = (actual.parse::<i64>(), bound.parse::<i64>()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// The canonical form apimachinery prints (`a in (x,y)`, `!a`, `a!=b`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        let joined = self.values.join(",");
        match self.operator {
            Operator::Exists | Operator::DoesNotExist => Ok(()),
            Operator::In => write!(f, " in ({joined})"),
            Operator::NotIn => write!(f, " notin ({joined})"),
            Operator::Equals => write!(f, "={joined}"),
            Operator::DoubleEquals => write!(f, "=={joined}"),
            Operator::NotEquals => write!(f, "!={joined}"),
            Operator::GreaterThan => write!(f, ">{joined}"),
            Operator::LessThan => write!(f, "<{joined}"),
        }
    }
}

/// A parsed label selector: the conjunction of its requirements.
///
/// `LabelQuery::default()` (no requirements) selects everything; [`LabelQuery::nothing`]
/// selects nothing (what an absent `metav1.LabelSelector` means).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelQuery {
    requirements: Vec<Requirement>,
    selects_nothing: bool,
}

impl LabelQuery {
    /// Selects every object (an empty `labelSelector`, an empty `metav1.LabelSelector`).
    pub fn everything() -> Self {
        Self::default()
    }

    /// Selects no object (an absent `metav1.LabelSelector`).
    pub fn nothing() -> Self {
        Self {
            requirements: Vec::new(),
            selects_nothing: true,
        }
    }

    /// Parses the `labelSelector` query-string syntax.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let tokens = lex(selector);
        let mut requirements = Parser {
            tokens,
            position: 0,
        }
        .parse()?;
        // apimachinery sorts by key so that equal selectors print equally.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self {
            requirements,
            selects_nothing: false,
        })
    }

    /// Converts a `metav1.LabelSelector` like `metav1.LabelSelectorAsSelector`: an empty
    /// selector (no `matchLabels`, no `matchExpressions`) selects everything.
    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::new(
                key.clone(),
                Operator::Equals,
                vec![value.clone()],
            )?);
        }
        for expression in selector.match_expressions.iter().flatten() {
            let operator = match expression.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::InvalidRequirement {
                        message: format!("{other:?} is not a valid label selector operator"),
                    });
                }
            };
            requirements.push(Requirement::new(
                expression.key.clone(),
                operator,
                expression.values.clone().unwrap_or_default(),
            )?);
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self {
            requirements,
            selects_nothing: false,
        })
    }

    /// Like [`LabelQuery::from_label_selector`], where an absent selector selects nothing.
    pub fn from_optional_label_selector(
        selector: Option<&LabelSelector>,
    ) -> Result<Self, SelectorError> {
        selector.map_or_else(|| Ok(Self::nothing()), Self::from_label_selector)
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.selects_nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// [`LabelQuery::matches`] on a stored object's JSON `metadata.labels`, without copying
    /// them (the fake server counts a budget's pods under its store lock).
    pub fn matches_json_labels(
        &self,
        labels: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> bool {
        !self.selects_nothing
            && self.requirements.iter().all(|r| {
                r.matches_value(
                    labels
                        .and_then(|labels| labels.get(r.key()))
                        .and_then(serde_json::Value::as_str),
                )
            })
    }

    /// Whether the object's labels (absent labels count as none) are selected.
    pub fn matches_object(&self, metadata: &ObjectMeta) -> bool {
        self.matches(object_labels(metadata))
    }

    /// True when the query does not restrict anything (it selects every object).
    pub fn is_everything(&self) -> bool {
        !self.selects_nothing && self.requirements.is_empty()
    }

    /// True for [`LabelQuery::nothing`].
    pub fn is_nothing(&self) -> bool {
        self.selects_nothing
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl FromStr for LabelQuery {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for LabelQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, requirement) in self.requirements.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

/// Whether a `metav1.LabelSelector` selects these labels, the way PDBs, ReplicaSets and
/// the eviction subresource use it: an absent selector selects nothing, an empty one
/// selects everything, and an invalid one (which validation should have refused) selects
/// nothing rather than everything.
pub fn label_selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    LabelQuery::from_optional_label_selector(selector).is_ok_and(|query| query.matches(labels))
}

/// The labels of an object, an empty map when it has none.
pub fn object_labels(metadata: &ObjectMeta) -> &BTreeMap<String, String> {
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

const QUALIFIED_NAME_DETAIL: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const DNS1123_SUBDOMAIN_DETAIL: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_VALUE_DETAIL: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, the shape of a label name and value.
fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    (first.is_ascii_lowercase() || first.is_ascii_digit())
                        && (last.is_ascii_lowercase() || last.is_ascii_digit())
                        && bytes
                            .iter()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                }
                _ => false,
            }
        })
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63 characters.
fn validate_label_key(key: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                problems.push("prefix part must be non-empty".to_owned());
            } else if !is_dns1123_subdomain(prefix) {
                problems.push(format!("prefix part {DNS1123_SUBDOMAIN_DETAIL}"));
            }
            *name
        }
        _ => {
            return Err(format!(
                "a qualified name {QUALIFIED_NAME_DETAIL} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ));
        }
    };
    if name.is_empty() {
        problems.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        problems.push("name part must be no more than 63 characters".to_owned());
    }
    if !name.is_empty() && !is_qualified_name_part(name) {
        problems.push(format!("name part {QUALIFIED_NAME_DETAIL}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn validate_label_value(value: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    if value.len() > 63 {
        problems.push("must be no more than 63 characters".to_owned());
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        problems.push(LABEL_VALUE_DETAIL.to_owned());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// How apimachinery prints a list of values in a validation message.
fn go_string_slice(values: &[String]) -> String {
    format!(
        "[]string{{{}}}",
        values
            .iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// apimachinery's aggregate error: one message as is, several in brackets.
fn aggregate(problems: &[String]) -> String {
    match problems {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenKind {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    kind: TokenKind,
    literal: String,
}

fn symbol_token(symbol: &str) -> Option<TokenKind> {
    Some(match symbol {
        ")" => TokenKind::ClosedPar,
        "," => TokenKind::Comma,
        "!" => TokenKind::DoesNotExist,
        "==" => TokenKind::DoubleEquals,
        "=" => TokenKind::Equals,
        ">" => TokenKind::GreaterThan,
        "<" => TokenKind::LessThan,
        "!=" => TokenKind::NotEquals,
        "(" => TokenKind::OpenPar,
        _ => return None,
    })
}

fn is_special_symbol(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits the selector into tokens. Like apimachinery, operators are the longest run of
/// symbol characters that still forms a known operator (`!=` but `=` then `(`), and
/// anything between symbols and whitespace is an identifier or the keywords `in`/`notin`.
fn lex(input: &str) -> Vec<Token> {
    let bytes = input.as_bytes();
    let mut tokens = Vec::new();
    let mut pos = 0;
    loop {
        while pos < bytes.len() && is_whitespace(bytes[pos]) {
            pos += 1;
        }
        if pos >= bytes.len() {
            tokens.push(Token {
                kind: TokenKind::EndOfString,
                literal: String::new(),
            });
            return tokens;
        }
        if is_special_symbol(bytes[pos]) {
            // Every single symbol character is a token, so this always finds one.
            let mut end = pos + 1;
            let mut kind = symbol_token(&input[pos..end]).unwrap_or(TokenKind::Comma);
            while end < bytes.len() && is_special_symbol(bytes[end]) {
                match symbol_token(&input[pos..=end]) {
                    Some(longer) => {
                        kind = longer;
                        end += 1;
                    }
                    None => break,
                }
            }
            tokens.push(Token {
                kind,
                literal: input[pos..end].to_owned(),
            });
            pos = end;
        } else {
            let start = pos;
            while pos < bytes.len() && !is_special_symbol(bytes[pos]) && !is_whitespace(bytes[pos])
            {
                pos += 1;
            }
            let literal = &input[start..pos];
            let kind = match literal {
                "in" => TokenKind::In,
                "notin" => TokenKind::NotIn,
                _ => TokenKind::Identifier,
            };
            tokens.push(Token {
                kind,
                literal: literal.to_owned(),
            });
        }
    }
}

/// Whether `in`/`notin` are keywords (after a key) or plain identifiers (keys, values).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    tokens: Vec<Token>,
    position: usize,
}

impl Parser {
    fn token_at(&self, position: usize, context: Context) -> (TokenKind, String) {
        let Some(token) = self.tokens.get(position) else {
            return (TokenKind::EndOfString, String::new());
        };
        let kind = match (context, token.kind) {
            (Context::Values, TokenKind::In | TokenKind::NotIn) => TokenKind::Identifier,
            (_, kind) => kind,
        };
        (kind, token.literal.clone())
    }

    fn lookahead(&self, context: Context) -> (TokenKind, String) {
        self.token_at(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (TokenKind, String) {
        let token = self.token_at(self.position, context);
        if self.position < self.tokens.len() {
            self.position += 1;
        }
        token
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (kind, literal) = self.lookahead(Context::Values);
            match kind {
                TokenKind::Identifier | TokenKind::DoesNotExist => {
                    let requirement = self
                        .parse_requirement()
                        .map_err(SelectorError::in_requirement)?;
                    requirements.push(requirement);
                    let (after, after_literal) = self.consume(Context::Values);
                    match after {
                        TokenKind::EndOfString => return Ok(requirements),
                        TokenKind::Comma => {
                            let (next, next_literal) = self.lookahead(Context::Values);
                            if next != TokenKind::Identifier && next != TokenKind::DoesNotExist {
                                return Err(SelectorError::syntax(format!(
                                    "found '{next_literal}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(SelectorError::syntax(format!(
                                "found '{after_literal}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                TokenKind::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::syntax(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(operator) = inferred {
            return Requirement::new(key, operator, Vec::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        Requirement::new(key, operator, values)
    }

    /// Reads `[!]key`; infers `Exists`/`DoesNotExist` when no operator follows.
    fn parse_key_and_infer_operator(
        &mut self,
    ) -> Result<(String, Option<Operator>), SelectorError> {
        let (mut kind, mut literal) = self.consume(Context::Values);
        let negated = kind == TokenKind::DoesNotExist;
        if negated {
            (kind, literal) = self.consume(Context::Values);
        }
        if kind != TokenKind::Identifier {
            return Err(SelectorError::syntax(format!(
                "found '{literal}', expected: identifier"
            )));
        }
        if let Err(detail) = validate_label_key(&literal) {
            // apimachinery reports it as a field error with an empty field path.
            return Err(SelectorError::InvalidRequirement {
                message: format!(": Invalid value: {literal:?}: {detail}"),
            });
        }
        if negated {
            return Ok((literal, Some(Operator::DoesNotExist)));
        }
        let (next, _) = self.lookahead(Context::Values);
        if next == TokenKind::EndOfString || next == TokenKind::Comma {
            return Ok((literal, Some(Operator::Exists)));
        }
        Ok((literal, None))
    }

    fn parse_operator(&mut self) -> Result<Operator, SelectorError> {
        let (kind, literal) = self.consume(Context::KeyAndOperator);
        Ok(match kind {
            TokenKind::In => Operator::In,
            TokenKind::NotIn => Operator::NotIn,
            TokenKind::Equals => Operator::Equals,
            TokenKind::DoubleEquals => Operator::DoubleEquals,
            TokenKind::NotEquals => Operator::NotEquals,
            TokenKind::GreaterThan => Operator::GreaterThan,
            TokenKind::LessThan => Operator::LessThan,
            _ => {
                let expected = [
                    Operator::In,
                    Operator::NotIn,
                    Operator::Equals,
                    Operator::DoubleEquals,
                    Operator::NotEquals,
                    Operator::GreaterThan,
                    Operator::LessThan,
                ]
                .map(Operator::as_str)
                .join(", ");
                return Err(SelectorError::syntax(format!(
                    "found '{literal}', expected: {expected}"
                )));
            }
        })
    }

    /// `(a,b,c)`; empty entries (`(a,,b)`, `()`) are the empty value, as in Kubernetes.
    fn parse_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (kind, literal) = self.consume(Context::Values);
        if kind != TokenKind::OpenPar {
            return Err(SelectorError::syntax(format!(
                "found '{literal}' expected: '('"
            )));
        }
        let (kind, literal) = self.lookahead(Context::Values);
        match kind {
            TokenKind::Identifier | TokenKind::Comma => {
                let values = self.parse_identifiers_list()?;
                let (closing, _) = self.consume(Context::Values);
                if closing != TokenKind::ClosedPar {
                    return Err(SelectorError::syntax(format!(
                        "found '{literal}', expected: ')'"
                    )));
                }
                Ok(values)
            }
            TokenKind::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(SelectorError::syntax(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            ))),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut values: Vec<String> = Vec::new();
        loop {
            let (kind, literal) = self.consume(Context::Values);
            match kind {
                TokenKind::Identifier => {
                    values.push(literal);
                    let (next, next_literal) = self.lookahead(Context::Values);
                    match next {
                        TokenKind::Comma => continue,
                        TokenKind::ClosedPar => return Ok(values),
                        _ => {
                            return Err(SelectorError::syntax(format!(
                                "found '{next_literal}', expected: ',' or ')'"
                            )));
                        }
                    }
                }
                TokenKind::Comma => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    let (next, _) = self.lookahead(Context::Values);
                    if next == TokenKind::ClosedPar {
                        values.push(String::new());
                        return Ok(values);
                    }
                    if next == TokenKind::Comma {
                        values.push(String::new());
                    }
                }
                _ => {
                    return Err(SelectorError::syntax(format!(
                        "found '{literal}', expected: ',', or identifier"
                    )));
                }
            }
        }
    }

    /// The single value after `=`, `==`, `!=`, `>` or `<`; nothing means the empty value.
    fn parse_exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        let (next, _) = self.lookahead(Context::Values);
        if next == TokenKind::EndOfString || next == TokenKind::Comma {
            return Ok(vec![String::new()]);
        }
        let (kind, literal) = self.consume(Context::Values);
        if kind == TokenKind::Identifier {
            Ok(vec![literal])
        } else {
            Err(SelectorError::syntax(format!(
                "found '{literal}', expected: identifier"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parsed_selectors_match_like_kubernetes() {
        let web = labels(&[("app", "web"), ("tier", "frontend"), ("replicas", "3")]);
        let bare = labels(&[]);
        // (selector, matches `web`, matches no labels)
        let cases: &[(&str, bool, bool)] = &[
            ("", true, true),
            ("app=web", true, false),
            ("app==web", true, false),
            ("app = web", true, false),
            ("app=db", false, false),
            ("app!=db", true, true),
            ("app!=web", false, true),
            ("app", true, false),
            ("!app", false, true),
            ("!missing", true, true),
            ("missing", false, false),
            ("app in (web,db)", true, false),
            ("app in (db)", false, false),
            ("app notin (db)", true, true),
            ("app notin (web, db)", false, true),
            ("app=web,tier=frontend", true, false),
            ("app=web,tier=backend", false, false),
            ("app=web, !legacy, tier in (frontend)", true, false),
            ("replicas>2", true, false),
            ("replicas>3", false, false),
            ("replicas<4", true, false),
            ("app>2", false, false),
            ("app=", false, false),
            ("missing=", false, false),
            ("missing!=", true, true),
            ("app in (in)", false, false),
            ("in=x", false, false),
            ("app in (,web)", true, false),
            ("missing in ()", false, false),
            ("missing notin ()", true, true),
            ("example.com/role", false, false),
        ];
        for (selector, on_web, on_bare) in cases {
            let query = LabelQuery::parse(selector)
                .unwrap_or_else(|e| panic!("{selector:?} should parse: {e}"));
            assert_eq!(query.matches(&web), *on_web, "{selector:?} on app=web");
            assert_eq!(query.matches(&bare), *on_bare, "{selector:?} on no labels");
        }
    }

    #[test]
    fn the_documented_example_parses() {
        // From the grammar's documentation: "x in (foo,,baz),y,z notin ()".
        let query = LabelQuery::parse("x in (foo,,baz),y,z notin ()").unwrap();
        assert_eq!(query.to_string(), "x in (,baz,foo),y,z notin ()");
        assert!(query.matches(&labels(&[("x", "baz"), ("y", "1")])));
        assert!(query.matches(&labels(&[("x", ""), ("y", "1"), ("z", "a")])));
        assert!(!query.matches(&labels(&[("x", "baz"), ("y", "1"), ("z", "")])));
        assert!(!query.matches(&labels(&[("x", "bar"), ("y", "1")])));
    }

    #[test]
    fn key_errors_carry_the_field_error_shape() {
        let error = LabelQuery::parse("-a=b").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "unable to parse requirement: : Invalid value: \"-a\": name part {QUALIFIED_NAME_DETAIL}"
            )
        );
        let error = LabelQuery::parse("a=b c").unwrap_err();
        assert_eq!(
            error.to_string(),
            "found 'c', expected: ',' or 'end of string'"
        );
        let error = LabelQuery::parse("a in (-x)").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "unable to parse requirement: values[0][a]: Invalid value: \"-x\": {LABEL_VALUE_DETAIL}"
            )
        );
    }

    #[test]
    fn empty_values_are_matched_as_the_empty_string() {
        let empty_app = labels(&[("app", "")]);
        for selector in ["app=", "app in (,x)", "app in ()", "app in (x,,y)"] {
            let query = LabelQuery::parse(selector).unwrap();
            assert!(query.matches(&empty_app), "{selector:?}");
        }
        assert!(
            !LabelQuery::parse("app in (x,y)")
                .unwrap()
                .matches(&empty_app)
        );
    }

    #[test]
    fn malformed_selectors_are_rejected_with_apimachinery_messages() {
        let cases: &[(&str, &str)] = &[
            ("a=b,", "found '', expected: identifier after ','"),
            ("a=b,,c", "found ',', expected: identifier after ','"),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            (
                ",a",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            (
                "=a",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            (
                "a in (b",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a in (b c)",
                "unable to parse requirement: found 'c', expected: ',' or ')'",
            ),
            (
                "a in (=)",
                "unable to parse requirement: found '=', expected: ',', ')' or identifier",
            ),
            (
                "a=(",
                "unable to parse requirement: found '(', expected: identifier",
            ),
            (
                "!",
                "unable to parse requirement: found '', expected: identifier",
            ),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ];
        for (selector, message) in cases {
            let error = LabelQuery::parse(selector).expect_err(selector);
            assert_eq!(error.to_string(), *message, "{selector:?}");
            assert!(
                matches!(error, SelectorError::Syntax { .. }),
                "{selector:?}: {error:?}"
            );
        }
    }

    #[test]
    fn invalid_keys_and_values_are_rejected() {
        for selector in [
            "-a=b",
            "a_=b",
            "Example.com/a=b",
            "a/b/c=d",
            "/a=b",
            "a=b c d",
            "a=-b",
            "a in (x, -y)",
            "n>x",
            &format!("{}=b", "k".repeat(64)),
            &format!("a={}", "v".repeat(64)),
        ] {
            let error = LabelQuery::parse(selector).expect_err(selector);
            assert!(
                error
                    .to_string()
                    .starts_with("unable to parse requirement: ")
                    || matches!(error, SelectorError::Syntax { .. }),
                "{selector:?}: {error}"
            );
        }
        let error = LabelQuery::parse("a=-b").unwrap_err();
        assert!(matches!(error, SelectorError::InvalidRequirement { .. }));
        assert!(
            error
                .to_string()
                .contains("a valid label must be an empty string")
        );
        let error = LabelQuery::parse("a/b/c").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("a qualified name must consist of")
        );
    }

    #[test]
    fn valid_keys_and_values_are_accepted() {
        for selector in [
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "app.kubernetes.io/name=my_app-1.2",
            "a=B_c",
            &format!("{}=b", "k".repeat(63)),
            &format!("a={}", "v".repeat(63)),
        ] {
            assert!(LabelQuery::parse(selector).is_ok(), "{selector:?}");
        }
    }

    #[test]
    fn display_is_canonical_and_sorted_by_key() {
        let query = LabelQuery::parse("z in (b,a,b), !y,x==1, w!=2 ,v,u notin (c)").unwrap();
        assert_eq!(query.to_string(), "u notin (c),v,w!=2,x==1,!y,z in (a,b)");
        let reparsed = LabelQuery::parse(&query.to_string()).unwrap();
        assert_eq!(reparsed, query);
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn label_selector_objects_match_like_pdbs() {
        let web = labels(&[("app", "web"), ("tier", "frontend")]);
        let bare = labels(&[]);
        let selector =
            |match_labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>| LabelSelector {
                match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
                match_expressions: (!exprs.is_empty()).then_some(exprs),
            };
        // (selector, matches `web`, matches no labels)
        let cases: Vec<(Option<LabelSelector>, bool, bool)> = vec![
            (None, false, false),
            (Some(LabelSelector::default()), true, true),
            (
                Some(LabelSelector {
                    match_labels: Some(BTreeMap::new()),
                    match_expressions: Some(Vec::new()),
                }),
                true,
                true,
            ),
            (Some(selector(&[("app", "web")], vec![])), true, false),
            (Some(selector(&[("app", "db")], vec![])), false, false),
            (
                Some(selector(&[("app", "web"), ("tier", "backend")], vec![])),
                false,
                false,
            ),
            (
                Some(selector(&[], vec![expression("app", "In", &["db", "web"])])),
                true,
                false,
            ),
            (
                Some(selector(&[], vec![expression("app", "NotIn", &["web"])])),
                false,
                true,
            ),
            (
                Some(selector(&[], vec![expression("tier", "Exists", &[])])),
                true,
                false,
            ),
            (
                Some(selector(&[], vec![expression("tier", "DoesNotExist", &[])])),
                false,
                true,
            ),
            (
                Some(selector(
                    &[("app", "web")],
                    vec![expression("tier", "In", &["backend"])],
                )),
                false,
                false,
            ),
            // Invalid selectors select nothing rather than everything.
            (
                Some(selector(&[], vec![expression("app", "Equals", &["web"])])),
                false,
                false,
            ),
            (
                Some(selector(&[], vec![expression("app", "In", &[])])),
                false,
                false,
            ),
            (
                Some(selector(&[], vec![expression("app", "Exists", &["web"])])),
                false,
                false,
            ),
        ];
        for (index, (selector, on_web, on_bare)) in cases.iter().enumerate() {
            assert_eq!(
                label_selector_matches(selector.as_ref(), &web),
                *on_web,
                "case {index}: {selector:?} on app=web"
            );
            assert_eq!(
                label_selector_matches(selector.as_ref(), &bare),
                *on_bare,
                "case {index}: {selector:?} on no labels"
            );
        }
    }

    #[test]
    fn label_selector_errors_name_the_problem() {
        let bad_operator = LabelSelector {
            match_expressions: Some(vec![expression("app", "Equals", &["web"])]),
            ..Default::default()
        };
        assert_eq!(
            LabelQuery::from_label_selector(&bad_operator)
                .unwrap_err()
                .to_string(),
            "\"Equals\" is not a valid label selector operator"
        );
        let no_values = LabelSelector {
            match_expressions: Some(vec![expression("app", "In", &[])]),
            ..Default::default()
        };
        assert!(
            LabelQuery::from_label_selector(&no_values)
                .unwrap_err()
                .to_string()
                .contains("values set can't be empty")
        );
    }

    #[test]
    fn everything_and_nothing_are_distinguished() {
        let web = labels(&[("app", "web")]);
        assert!(LabelQuery::everything().is_everything());
        assert!(LabelQuery::everything().matches(&web));
        assert!(LabelQuery::nothing().is_nothing());
        assert!(!LabelQuery::nothing().matches(&web));
        assert!(!LabelQuery::parse("app").unwrap().is_everything());
        let metadata = ObjectMeta {
            labels: Some(web),
            ..Default::default()
        };
        assert!(
            LabelQuery::parse("app=web")
                .unwrap()
                .matches_object(&metadata)
        );
        assert!(
            LabelQuery::parse("!app")
                .unwrap()
                .matches_object(&ObjectMeta::default())
        );
    }

    #[test]
    fn json_labels_match_like_the_label_map() {
        let objects = [
            vec![],
            vec![("app", "web")],
            vec![("app", "db"), ("tier", "3")],
            vec![("app", "web"), ("tier", "1"), ("env", "prod")],
        ];
        let selectors = [
            "",
            "app=web",
            "app!=web",
            "app in (web,db)",
            "app notin (web)",
            "tier",
            "!tier",
            "tier>2",
            "app=web,env=prod",
        ];
        for selector in selectors {
            let query = LabelQuery::parse(selector).unwrap();
            for pairs in &objects {
                let map = labels(pairs);
                let json = serde_json::to_value(&map).unwrap();
                assert_eq!(
                    query.matches_json_labels(json.as_object()),
                    query.matches(&map),
                    "{selector:?} on {pairs:?}"
                );
            }
            assert_eq!(
                query.matches_json_labels(None),
                query.matches(&BTreeMap::new()),
                "{selector:?} on an object without labels"
            );
        }
        assert!(!LabelQuery::nothing().matches_json_labels(None));
    }
}
