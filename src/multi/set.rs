//! The pure part of a multi-resource lock: the checks on a set of
//! resources (empty, too many, a resource twice) and, for a client with a
//! Redis Cluster node, whether its keys share one hash slot. No I/O;
//! tested here.

use std::collections::HashMap;

use crate::error::set::ResourceSetError;
use crate::logic::limits::MAX_RESOURCES;

/// Checks a set of resources: at least one, at most [`MAX_RESOURCES`],
/// none twice. A resource given twice is an error rather than merged: the
/// caller asked for one token per entry and would get fewer. (Each name's
/// own checks, empty or too long, are the mutex's, made per target.)
pub(crate) fn check<S: AsRef<str>>(resources: &[S]) -> Result<(), ResourceSetError> {
    if resources.is_empty() {
        return Err(ResourceSetError::Empty);
    }
    if resources.len() > MAX_RESOURCES {
        return Err(ResourceSetError::TooMany {
            count: resources.len(),
            max: MAX_RESOURCES,
        });
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(resources.len());
    for (second, resource) in resources.iter().enumerate() {
        if let Some(&first) = seen.get(resource.as_ref()) {
            return Err(ResourceSetError::Duplicate {
                resource: resource.as_ref().to_owned(),
                first,
                second,
            });
        }
        seen.insert(resource.as_ref(), second);
    }
    Ok(())
}

/// The first resource whose keys are not all in the hash slot of the
/// first resource's first key, given each resource's key slots: `None`
/// when one script can carry every key on a cluster node. A set that
/// spans slots is refused (not split per slot): split, a node would no
/// longer decide all or nothing in one step.
pub(crate) fn other_slot(slots: &[Vec<u16>]) -> Option<usize> {
    let first = *slots.first()?.first()?;
    slots
        .iter()
        .position(|keys| keys.iter().any(|&slot| slot != first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_too_many_and_repeated_sets_are_refused() {
        let none: [&str; 0] = [];
        assert_eq!(check(&none), Err(ResourceSetError::Empty));
        let many: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("r{i}")).collect();
        assert_eq!(
            check(&many),
            Err(ResourceSetError::TooMany {
                count: MAX_RESOURCES + 1,
                max: MAX_RESOURCES
            })
        );
        assert_eq!(check(&many[..MAX_RESOURCES]), Ok(()));
        assert_eq!(
            check(&["a", "b", "c", "b"]),
            Err(ResourceSetError::Duplicate {
                resource: "b".into(),
                first: 1,
                second: 3
            })
        );
        assert_eq!(check(&["a"]), Ok(()));
        // Names that differ only by case are different resources.
        assert_eq!(check(&["a", "A"]), Ok(()));
    }

    #[test]
    fn a_set_spanning_slots_is_found() {
        assert_eq!(other_slot(&[]), None);
        assert_eq!(other_slot(&[vec![7, 7], vec![7, 7]]), None);
        assert_eq!(other_slot(&[vec![7, 7], vec![7, 7], vec![7, 9]]), Some(2));
        assert_eq!(other_slot(&[vec![7, 7], vec![8, 8]]), Some(1));
        // A resource whose own two keys disagree is found too.
        assert_eq!(other_slot(&[vec![7, 8]]), Some(0));
    }
}
