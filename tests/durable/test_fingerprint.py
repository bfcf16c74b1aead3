"""Differences between recorded settings: nested keys dotted, absent keys named, values as canonical JSON."""

from durable.fingerprint import describe_differences, differing_keys


def test_differences_name_dotted_keys_absent_sides_and_canonical_values():
    old = {"voting": {"votes": 4, "mode": "sample"}, "seeds": [0, 1], "gone": True}
    new = {"voting": {"votes": 8, "mode": "sample"}, "seeds": [0, 1, 2], "added": None}
    assert differing_keys(old, new) == [
        ("added", "(absent)", "null"),
        ("gone", "true", "(absent)"),
        ("seeds", "[0,1]", "[0,1,2]"),
        ("voting.votes", "4", "8"),
    ]
    assert describe_differences(old, new, limit=2) == "added: (absent) -> null; gone: true -> (absent); and 2 more"
    assert describe_differences({"t": (1, 2)}, {"t": [1, 2]}) == ""  # as both read back from JSON
