//! The one region → partition table: which partition a region belongs to (as ARNs spell it)
//! and the DNS suffix its endpoints live under. Both the EKS token signer (the STS host a
//! token is addressed to) and the node-role ARN checks (the partition a role must be in)
//! read it, so they cannot disagree about a region.
//!
//! Pure (no SDK): it builds without the `runtime` feature, for the fuzz targets.
//!
//! Facts from the SDKs' `partitions.json` (region regex and `dnsSuffix` per partition);
//! the EU sovereign partition is `aws-eusc` (`^eusc-(de)-\w+-\d+$`, `amazonaws.eu`, so STS
//! is `sts.eusc-de-east-1.amazonaws.eu`).

/// An AWS partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    Aws,
    AwsCn,
    AwsUsGov,
    AwsIso,
    AwsIsoB,
    AwsIsoE,
    AwsIsoF,
    AwsEusc,
}

/// Region-name prefix → partition; first match wins (`us-isob-` before `us-iso-`). A region
/// that matches none is in `aws`, as the SDKs' default partition.
const PREFIXES: [(&str, Partition); 7] = [
    ("cn-", Partition::AwsCn),
    ("us-gov-", Partition::AwsUsGov),
    ("us-isob-", Partition::AwsIsoB),
    ("us-isof-", Partition::AwsIsoF),
    ("us-iso-", Partition::AwsIso),
    ("eu-isoe-", Partition::AwsIsoE),
    ("eusc-", Partition::AwsEusc),
];

impl Partition {
    /// Every partition, for tests and tables.
    pub const ALL: [Self; 8] = [
        Self::Aws,
        Self::AwsCn,
        Self::AwsUsGov,
        Self::AwsIso,
        Self::AwsIsoB,
        Self::AwsIsoE,
        Self::AwsIsoF,
        Self::AwsEusc,
    ];

    /// The partition a region belongs to, from the region name's prefix.
    pub fn of_region(region: &str) -> Self {
        PREFIXES
            .iter()
            .find(|(prefix, _)| region.starts_with(prefix))
            .map_or(Self::Aws, |(_, partition)| *partition)
    }

    /// `aws`, `aws-cn`, ... as in ARNs.
    pub fn id(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::AwsCn => "aws-cn",
            Self::AwsUsGov => "aws-us-gov",
            Self::AwsIso => "aws-iso",
            Self::AwsIsoB => "aws-iso-b",
            Self::AwsIsoE => "aws-iso-e",
            Self::AwsIsoF => "aws-iso-f",
            Self::AwsEusc => "aws-eusc",
        }
    }

    /// The partition an ARN names (`arn:<id>:...`), `None` for an unknown one.
    pub fn from_id(id: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.id() == id)
    }

    /// The region a partition's global services (IAM) are signed for, e.g. `us-east-1`.
    pub fn home_region(self) -> &'static str {
        match self {
            Self::Aws => "us-east-1",
            Self::AwsCn => "cn-north-1",
            Self::AwsUsGov => "us-gov-west-1",
            Self::AwsIso => "us-iso-east-1",
            Self::AwsIsoB => "us-isob-east-1",
            Self::AwsIsoE => "eu-isoe-west-1",
            Self::AwsIsoF => "us-isof-south-1",
            Self::AwsEusc => "eusc-de-east-1",
        }
    }

    /// The DNS suffix of the partition's regional endpoints.
    pub fn dns_suffix(self) -> &'static str {
        match self {
            Self::Aws | Self::AwsUsGov => "amazonaws.com",
            Self::AwsCn => "amazonaws.com.cn",
            Self::AwsIso => "c2s.ic.gov",
            Self::AwsIsoB => "sc2s.sgov.gov",
            Self::AwsIsoE => "cloud.adc-e.uk",
            Self::AwsIsoF => "csp.hci.ic.gov",
            Self::AwsEusc => "amazonaws.eu",
        }
    }
}

/// IAM is global: one endpoint per partition, signed for that partition's home region.
/// Returns `(host, signing_region)`, e.g. `("iam.amazonaws.com", "us-east-1")`.
///
/// Facts from the SDKs' endpoint rules for `iam` (the partition's global endpoint).
pub fn iam_endpoint(region: &str) -> (String, &'static str) {
    let partition = Partition::of_region(region);
    let signing_region = partition.home_region();
    let host = match partition {
        Partition::Aws => "iam.amazonaws.com".to_owned(),
        Partition::AwsUsGov => "iam.us-gov.amazonaws.com".to_owned(),
        _ => format!("iam.{signing_region}.{}", partition.dns_suffix()),
    };
    (host, signing_region)
}

/// The regional STS host of `region`, e.g. `sts.cn-north-1.amazonaws.com.cn`.
pub fn sts_host(region: &str) -> String {
    format!("sts.{region}.{}", Partition::of_region(region).dns_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iam_is_global_per_partition() {
        assert_eq!(
            iam_endpoint("eu-west-1"),
            ("iam.amazonaws.com".to_owned(), "us-east-1")
        );
        assert_eq!(
            iam_endpoint("cn-northwest-1"),
            ("iam.cn-north-1.amazonaws.com.cn".to_owned(), "cn-north-1")
        );
        assert_eq!(
            iam_endpoint("us-gov-east-1"),
            ("iam.us-gov.amazonaws.com".to_owned(), "us-gov-west-1")
        );
        assert_eq!(
            iam_endpoint("eusc-de-east-1"),
            (
                "iam.eusc-de-east-1.amazonaws.eu".to_owned(),
                "eusc-de-east-1"
            )
        );
    }

    #[test]
    fn every_partition_has_its_regions_and_sts_host() {
        let table = [
            ("eu-west-1", "aws", "sts.eu-west-1.amazonaws.com"),
            ("ap-southeast-7", "aws", "sts.ap-southeast-7.amazonaws.com"),
            ("cn-north-1", "aws-cn", "sts.cn-north-1.amazonaws.com.cn"),
            (
                "cn-northwest-1",
                "aws-cn",
                "sts.cn-northwest-1.amazonaws.com.cn",
            ),
            (
                "us-gov-west-1",
                "aws-us-gov",
                "sts.us-gov-west-1.amazonaws.com",
            ),
            ("us-iso-east-1", "aws-iso", "sts.us-iso-east-1.c2s.ic.gov"),
            (
                "us-isob-east-1",
                "aws-iso-b",
                "sts.us-isob-east-1.sc2s.sgov.gov",
            ),
            (
                "eu-isoe-west-1",
                "aws-iso-e",
                "sts.eu-isoe-west-1.cloud.adc-e.uk",
            ),
            (
                "us-isof-south-1",
                "aws-iso-f",
                "sts.us-isof-south-1.csp.hci.ic.gov",
            ),
            (
                "eusc-de-east-1",
                "aws-eusc",
                "sts.eusc-de-east-1.amazonaws.eu",
            ),
        ];
        for (region, partition, host) in table {
            assert_eq!(Partition::of_region(region).id(), partition, "{region}");
            assert_eq!(sts_host(region), host, "{region}");
        }
    }

    #[test]
    fn every_home_region_is_in_its_own_partition() {
        for partition in Partition::ALL {
            assert_eq!(Partition::of_region(partition.home_region()), partition);
        }
    }

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for partition in Partition::ALL {
            assert_eq!(Partition::from_id(partition.id()), Some(partition));
        }
        assert_eq!(Partition::from_id("aws-moon"), None);
        assert_eq!(Partition::from_id("AWS"), None);
    }
}
