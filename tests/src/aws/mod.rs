//! Fake AWS endpoints: Auto Scaling, EC2, SNS and EKS behind one local HTTP server, and an
//! EventBridge bus the fake services put their events on.
//!
//! The real AWS SDK clients reach it through `AWS_ENDPOINT_URL` (or
//! `aws_config::...::endpoint_url`) and talk to it exactly as to AWS: requests are routed by
//! the service in the SigV4 credential scope of their `Authorization` header, answered in the
//! service's own protocol (`awsQuery`, `ec2Query`, `restJson1`) with AWS's error codes and
//! envelopes, so no client needs a test-only code path.
//!
//! Beyond the APIs, the fake keeps what a test needs to judge a function: the Auto Scaling
//! lifecycle state machine (tokens, heartbeat and global timeouts, default results) with a
//! record of every completion, SNS subscriptions that hand the Lambda SNS event to a test,
//! EC2's Spot interruptions and scheduled maintenance with the events EC2 and AWS Health put
//! on the bus, fault injection (throttling, 5xx, latency) and a log of every request.
//!
//! ```no_run
//! # async fn example() -> Result<(), node_manager_testkit::aws::FakeAwsError> {
//! use node_manager_testkit::account::FakeAccount;
//! use node_manager_testkit::aws::FakeAws;
//! let account = FakeAccount::reference();
//! let credentials = account.add_role_credentials("terminating-hook");
//! let aws = FakeAws::start(account).await?;
//! let sdk_config = aws.sdk_config(&credentials).await;
//! # let _ = sdk_config; Ok(()) }
//! ```

mod autoscaling;
mod ec2;
mod eks;
mod elb;
mod eventbridge;
mod faults;
mod iam;
mod interruptions;
#[cfg(test)]
mod interruptions_tests;
mod protocol;
mod signature;
mod sns;

pub use autoscaling::{
    CompletedBy, FakeAutoScaling, FakeAutoScalingGroup, FakeLaunchTemplate, FakeLifecycleHook,
    FakeRefreshPreferences, HeartbeatRecord, InstanceMaintenancePolicy, InstanceRefreshStatus,
    InstanceRefreshView, LaunchedInstance, LifecycleCompletion, LifecycleNotice,
    LifecycleTransition, WarmPoolState,
};
pub use ec2::{FakeEc2, FakeEc2LaunchTemplate, FakeInstance, InstanceState};
pub use eks::{FakeAccessEntry, FakeCluster, FakeEks, FakeNodegroup};
pub use elb::{FakeElb, FakeLoadBalancer, FakeTargetGroup};
pub use eventbridge::{EventPattern, EventSubscription, FakeEventBridge};
pub use faults::{AwsFault, AwsFaultKind, FakeAwsFaults};
pub use iam::FakeIam;
pub use interruptions::{
    FakeInterruptions, FakeSpotRequest, ScheduledEvent, ScheduledEventCode, SpotInterruption,
    SpotInterruptionAction,
};
pub use sns::{FakeSns, PublishSource, PublishedMessage, SnsSubscription, SubscriptionFilter};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Response;

use crate::account::{FakeAccount, FakeCredentials};
pub(crate) use protocol::uuid_v4;
use protocol::{ApiError, Reply};

/// A failure of the fake itself or of a test's use of it (not an AWS API error: those go to
/// the client over HTTP).
#[derive(Debug, thiserror::Error)]
pub enum FakeAwsError {
    #[error("could not start the fake AWS server on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    #[error("no Auto Scaling group named {0:?}: add it with autoscaling().add_group first")]
    UnknownGroup(String),
    #[error(
        "Auto Scaling group {group:?} has no {transition} lifecycle hook: add one with add_hook"
    )]
    NoLifecycleHook { group: String, transition: String },
    #[error("no SNS topic {0:?}: create it with sns().create_topic first")]
    UnknownTopic(String),
    #[error("no EKS cluster named {0:?}: add it with eks().add_cluster first")]
    UnknownCluster(String),
    #[error(
        "Auto Scaling group {0:?} has no launch template: declare one with FakeAutoScalingGroup::launch_template"
    )]
    NoLaunchTemplate(String),
    #[error("no EC2 instance {0:?}: add it with ec2().add_instance first")]
    UnknownInstance(String),
    #[error("EC2 instance {0:?} is not a Spot instance: declare it with FakeInstance::spot")]
    NotSpot(String),
    /// Auto Scaling's Spot instances are terminated when interrupted, never stopped.
    #[error(
        "instance {instance_id:?} is in Auto Scaling group {group:?}, which terminates interrupted Spot instances: {action} is not an interruption it carries out"
    )]
    GroupOnlyTerminates {
        instance_id: String,
        group: String,
        action: String,
    },
    /// What the fake Auto Scaling API would answer a client (e.g. `InstanceRefreshInProgress`).
    #[error("Auto Scaling refused: {code}: {message}")]
    AutoScalingApi { code: String, message: String },
}

/// The AWS services the fake serves, as named in a SigV4 credential scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    AutoScaling,
    Ec2,
    Sns,
    Eks,
    Iam,
    /// Elastic Load Balancing v2 (target groups).
    LoadBalancing,
    /// Classic load balancers: the same signing name, API version `2012-06-01`.
    ClassicLoadBalancing,
}

impl Service {
    /// The SigV4 signing name (`autoscaling`, `ec2`, `sns`, `eks`).
    pub fn signing_name(self) -> &'static str {
        match self {
            Self::AutoScaling => "autoscaling",
            Self::Ec2 => "ec2",
            Self::Sns => "sns",
            Self::Eks => "eks",
            Self::Iam => "iam",
            Self::LoadBalancing | Self::ClassicLoadBalancing => "elasticloadbalancing",
        }
    }

    fn from_signing_name(name: &str) -> Option<Self> {
        match name {
            "autoscaling" => Some(Self::AutoScaling),
            "ec2" => Some(Self::Ec2),
            "sns" => Some(Self::Sns),
            "eks" => Some(Self::Eks),
            "iam" => Some(Self::Iam),
            "elasticloadbalancing" => Some(Self::LoadBalancing),
            _ => None,
        }
    }
}

/// One request the fake answered, like a CloudTrail record.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsRequestRecord {
    pub request_id: String,
    /// `None` when the request could not be attributed to a served service.
    pub service: Option<Service>,
    /// `CompleteLifecycleAction`, `DescribeCluster`, ... (empty when unknown).
    pub operation: String,
    pub access_key_id: Option<String>,
    /// The IAM principal of the access key, when the account knows it.
    pub principal_arn: Option<String>,
    /// Query parameters (without `Action`/`Version`), or for EKS the path parameters and the
    /// members of the JSON body.
    pub params: BTreeMap<String, String>,
    pub status: u16,
    /// The AWS error code of a failed request.
    pub error_code: Option<String>,
    pub user_agent: Option<String>,
}

/// State shared by the server, the timers and the handles.
pub(crate) struct Shared {
    pub(crate) account: FakeAccount,
    log: Mutex<Vec<AwsRequestRecord>>,
    pub(crate) faults: faults::FaultState,
    pub(crate) autoscaling: autoscaling::AutoScalingShared,
    pub(crate) ec2: Mutex<ec2::Ec2State>,
    pub(crate) sns: Mutex<sns::SnsState>,
    pub(crate) eks: Mutex<eks::EksState>,
    pub(crate) iam: Mutex<iam::IamState>,
    pub(crate) elb: Mutex<elb::ElbState>,
    pub(crate) eventbridge: Mutex<eventbridge::EventBridgeState>,
}

/// Locks a mutex, surviving a panicked holder (test state is still worth reading).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running fake. Dropping it stops the server.
pub struct FakeAws {
    shared: Arc<Shared>,
    address: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAws {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl std::fmt::Debug for FakeAws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeAws")
            .field("address", &self.address)
            .field("account_id", &self.shared.account.account_id)
            .finish_non_exhaustive()
    }
}

impl FakeAws {
    /// Starts the fake on `127.0.0.1` on a free port, for `account`. Only credentials the
    /// account issued (`FakeAccount::add_role_credentials`) are accepted.
    pub async fn start(account: FakeAccount) -> Result<Self, FakeAwsError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(FakeAwsError::Bind)?;
        let address = listener.local_addr().map_err(FakeAwsError::Bind)?;
        let shared = Arc::new(Shared {
            account,
            log: Mutex::default(),
            faults: faults::FaultState::default(),
            autoscaling: autoscaling::AutoScalingShared::default(),
            ec2: Mutex::default(),
            sns: Mutex::default(),
            eks: Mutex::default(),
            iam: Mutex::default(),
            elb: Mutex::default(),
            eventbridge: Mutex::default(),
        });
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "fake AWS server stopped");
            }
        });
        Ok(Self {
            shared,
            address,
            server,
        })
    }

    /// `http://127.0.0.1:<port>`: the value for `AWS_ENDPOINT_URL`.
    pub fn endpoint_url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn account(&self) -> &FakeAccount {
        &self.shared.account
    }

    pub fn autoscaling(&self) -> FakeAutoScaling {
        FakeAutoScaling::new(Arc::clone(&self.shared))
    }

    pub fn ec2(&self) -> FakeEc2 {
        FakeEc2::new(Arc::clone(&self.shared))
    }

    pub fn sns(&self) -> FakeSns {
        FakeSns::new(Arc::clone(&self.shared))
    }

    pub fn eks(&self) -> FakeEks {
        FakeEks::new(Arc::clone(&self.shared))
    }

    pub fn iam(&self) -> FakeIam {
        FakeIam::new(Arc::clone(&self.shared))
    }

    /// Target groups and classic load balancers.
    pub fn elb(&self) -> FakeElb {
        FakeElb::new(Arc::clone(&self.shared))
    }

    pub fn eventbridge(&self) -> FakeEventBridge {
        FakeEventBridge::new(Arc::clone(&self.shared))
    }

    /// Spot interruptions, rebalance recommendations and scheduled maintenance: what EC2 and
    /// AWS Health report and put on the bus about an instance about to go.
    pub fn interruptions(&self) -> FakeInterruptions {
        FakeInterruptions::new(Arc::clone(&self.shared))
    }

    pub fn faults(&self) -> FakeAwsFaults {
        FakeAwsFaults::new(Arc::clone(&self.shared))
    }

    /// Every request answered so far, oldest first.
    pub fn requests(&self) -> Vec<AwsRequestRecord> {
        lock(&self.shared.log).clone()
    }

    /// The requests for one operation (e.g. `"CompleteLifecycleAction"`).
    pub fn requests_for(&self, operation: &str) -> Vec<AwsRequestRecord> {
        lock(&self.shared.log)
            .iter()
            .filter(|record| record.operation == operation)
            .cloned()
            .collect()
    }

    /// The environment a process (a function binary) needs to reach this fake with
    /// `credentials` through the standard `aws-config` chain.
    pub fn environment(&self, credentials: &FakeCredentials) -> Vec<(String, String)> {
        let mut env = vec![
            ("AWS_ENDPOINT_URL".to_owned(), self.endpoint_url()),
            ("AWS_REGION".to_owned(), self.shared.account.region.clone()),
            (
                "AWS_DEFAULT_REGION".to_owned(),
                self.shared.account.region.clone(),
            ),
            (
                "AWS_ACCESS_KEY_ID".to_owned(),
                credentials.access_key_id.clone(),
            ),
            (
                "AWS_SECRET_ACCESS_KEY".to_owned(),
                credentials.secret_access_key.clone(),
            ),
        ];
        if let Some(token) = &credentials.session_token {
            env.push(("AWS_SESSION_TOKEN".to_owned(), token.clone()));
        }
        env
    }

    /// An `SdkConfig` for the real SDK clients: this endpoint, the account's region, static
    /// `credentials`, the project's HTTP client, and no retries (so a test sees each injected
    /// fault; set a retry config on the client builder to test retries).
    pub async fn sdk_config(&self, credentials: &FakeCredentials) -> aws_types::SdkConfig {
        let provider = aws_credential_types::Credentials::new(
            credentials.access_key_id.clone(),
            credentials.secret_access_key.clone(),
            credentials.session_token.clone(),
            None,
            "node-manager-testkit",
        );
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_types::region::Region::new(
                self.shared.account.region.clone(),
            ))
            .endpoint_url(self.endpoint_url())
            .credentials_provider(provider)
            .http_client(node_manager::aws::http_client::https_client())
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(Duration::from_secs(10))
                    .build(),
            )
            .load()
            .await
    }
}

/// The parts of a SigV4 `Authorization` header the fake routes and authenticates by.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SigV4Scope {
    access_key_id: String,
    region: String,
    service: String,
}

/// Parses `AWS4-HMAC-SHA256 Credential=AKID/20240101/eu-west-1/eks/aws4_request, ...`.
fn parse_authorization(header: &str) -> Option<SigV4Scope> {
    let rest = header.trim().strip_prefix("AWS4-HMAC-SHA256")?;
    let credential = rest
        .split(',')
        .map(str::trim)
        .find_map(|part| part.strip_prefix("Credential="))?;
    let mut parts = credential.split('/');
    let access_key_id = parts.next()?.to_owned();
    let _date = parts.next()?;
    let region = parts.next()?.to_owned();
    let service = parts.next()?.to_owned();
    (parts.next()? == "aws4_request").then_some(SigV4Scope {
        access_key_id,
        region,
        service,
    })
}

/// What a request asks for, once routed.
pub(crate) struct ParsedRequest {
    pub method: axum::http::Method,
    /// Path segments, percent-decoded.
    pub segments: Vec<String>,
    pub query: BTreeMap<String, String>,
    pub body: axum::body::Bytes,
    pub form: protocol::QueryParams,
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response<Body> {
    let request_id = protocol::request_id();
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 16 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let user_agent = header("user-agent");
    let scope = header("authorization").and_then(|value| parse_authorization(&value));
    let path = parts.uri.path().to_owned();
    let segments: Vec<String> = path
        .split('/')
        .filter(|segment| !segment.is_empty())
        .map(protocol::percent_decode)
        .collect();
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    let is_form = header("content-type")
        .is_some_and(|value| value.starts_with("application/x-www-form-urlencoded"));
    let form = if is_form {
        protocol::parse_form(&body)
    } else {
        BTreeMap::new()
    };
    let parsed = ParsedRequest {
        method: parts.method.clone(),
        segments,
        query,
        body,
        form,
    };

    // Without a usable credential scope, answer in the protocol the request looks like.
    let guessed = if path.starts_with("/clusters") {
        Service::Eks
    } else {
        Service::AutoScaling
    };
    let mut record = AwsRequestRecord {
        request_id: request_id.clone(),
        service: None,
        operation: String::new(),
        access_key_id: scope.as_ref().map(|s| s.access_key_id.clone()),
        principal_arn: None,
        params: BTreeMap::new(),
        status: 0,
        error_code: None,
        user_agent,
    };
    let Some(scope) = scope else {
        let error = if guessed == Service::Eks {
            ApiError::new(
                403,
                "MissingAuthenticationTokenException",
                "Missing Authentication Token",
            )
        } else {
            ApiError::new(
                403,
                "MissingAuthenticationToken",
                "Request is missing Authentication Token",
            )
        };
        return finish(&shared, record, guessed, Err(error), &request_id);
    };
    let Some(mut service) = Service::from_signing_name(&scope.service) else {
        let error = ApiError::new(
            400,
            "UnknownService",
            format!(
                "the fake AWS endpoint does not serve {:?} (it serves autoscaling, ec2, sns, eks, iam, elasticloadbalancing)",
                scope.service
            ),
        );
        return finish(&shared, record, guessed, Err(error), &request_id);
    };
    if service == Service::LoadBalancing
        && parsed.form.get("Version").map(String::as_str) == Some(elb::CLASSIC_VERSION)
    {
        service = Service::ClassicLoadBalancing;
    }
    record.service = Some(service);
    record.operation = operation_name(service, &parsed);
    record.params = key_params(service, &parsed);

    if let Err(error) = authenticate(&shared, service, &scope, &parts, &parsed.body) {
        return finish(&shared, record, service, Err(error), &request_id);
    }
    record.principal_arn = shared
        .account
        .credentials(&scope.access_key_id)
        .map(|c| c.principal_arn);

    match shared.faults.decide(service, &record.operation) {
        faults::Decision::Proceed => {}
        faults::Decision::Delay(delay) => tokio::time::sleep(delay).await,
        faults::Decision::Fail(kind) => {
            let error = faults::error_for(service, kind);
            return finish(&shared, record, service, Err(error), &request_id);
        }
    }

    let result = match service {
        Service::AutoScaling => autoscaling::dispatch(&shared, &record.operation, &parsed.form),
        Service::Ec2 => ec2::dispatch(&shared, &record.operation, &parsed.form),
        Service::Sns => sns::dispatch(&shared, &record.operation, &parsed.form),
        Service::Eks => eks::dispatch(&shared, &record.operation, &parsed),
        Service::Iam => iam::dispatch(&shared, &record.operation, &parsed.form),
        Service::LoadBalancing | Service::ClassicLoadBalancing => {
            elb::dispatch(&shared, &record.operation, &parsed.form)
        }
    };
    finish(&shared, record, service, result, &request_id)
}

fn finish(
    shared: &Shared,
    mut record: AwsRequestRecord,
    service: Service,
    result: Result<Reply, ApiError>,
    request_id: &str,
) -> Response<Body> {
    let response = match result {
        Ok(reply) => protocol::render_reply(service, &record.operation, reply, request_id),
        Err(error) => {
            record.error_code = Some(error.code.clone());
            protocol::render_error(service, &error, request_id)
        }
    };
    record.status = response.status().as_u16();
    lock(&shared.log).push(record);
    response
}

/// Rejects credentials the account did not issue, a wrong session token, or a signature
/// that the issued secret key does not reproduce, each with the service's own error.
fn authenticate(
    shared: &Shared,
    service: Service,
    scope: &SigV4Scope,
    parts: &axum::http::request::Parts,
    body: &[u8],
) -> Result<(), ApiError> {
    let session_token = parts
        .headers
        .get("x-amz-security-token")
        .and_then(|value| value.to_str().ok());
    let known = shared
        .account
        .credentials(&scope.access_key_id)
        .filter(|credentials| match &credentials.session_token {
            Some(expected) => session_token == Some(expected.as_str()),
            None => true,
        });
    let Some(credentials) = known else {
        return Err(match service {
            Service::Ec2 => ApiError::new(
                401,
                "AuthFailure",
                "AWS was not able to validate the provided access credentials",
            ),
            Service::Eks => ApiError::new(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ),
            _ => ApiError::new(
                403,
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            ),
        });
    };
    if signature::matches(&credentials, scope, parts, body) {
        return Ok(());
    }
    const MISMATCH: &str = "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.";
    Err(match service {
        Service::Ec2 => ApiError::new(
            401,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
        ),
        Service::Eks => ApiError::new(403, "InvalidSignatureException", MISMATCH),
        _ => ApiError::new(403, "SignatureDoesNotMatch", MISMATCH),
    })
}

fn operation_name(service: Service, request: &ParsedRequest) -> String {
    match service {
        Service::Eks => eks::operation_name(&request.method, &request.segments).to_owned(),
        _ => request.form.get("Action").cloned().unwrap_or_default(),
    }
}

fn key_params(service: Service, request: &ParsedRequest) -> BTreeMap<String, String> {
    match service {
        Service::Eks => {
            let mut params = eks::path_params(&request.segments);
            params.extend(request.query.clone());
            if let Ok(serde_json::Value::Object(body)) =
                serde_json::from_slice::<serde_json::Value>(&request.body)
            {
                for (key, value) in body {
                    let value = match value {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    params.insert(key, value);
                }
            }
            params
        }
        _ => request
            .form
            .iter()
            .filter(|(key, _)| key.as_str() != "Action" && key.as_str() != "Version")
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_scope_names_key_region_and_service() {
        let header = "AWS4-HMAC-SHA256 Credential=ASIAKEY/20240101/eu-west-1/autoscaling/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc";
        assert_eq!(
            parse_authorization(header),
            Some(SigV4Scope {
                access_key_id: "ASIAKEY".to_owned(),
                region: "eu-west-1".to_owned(),
                service: "autoscaling".to_owned(),
            })
        );
        assert_eq!(parse_authorization("Bearer abc"), None);
        assert_eq!(
            parse_authorization("AWS4-HMAC-SHA256 Credential=A/2024/eu/eks/other"),
            None
        );
    }
}
