"""Fact extraction and matching (hat_jax.judges.facts), on hand-checked strings."""

import pytest

from hat_jax.judges import facts


def test_numbers_in_reads_formats_and_skips_list_markers():
    got = facts.numbers_in("1. 原价1,299元\n2、打8折，省20%，¥199.00")
    assert [(n.value, n.readings) for n in got] == [(1299.0, (1299.0,)), (8.0, (8.0, 0.8)), (20.0, (20.0, 0.2)), (199.0, (199.0,))]


@pytest.mark.parametrize("reply", ["199", "到手价199.0", "¥199", "199元", "只要 199.00 元"])
def test_number_fact_stated_in_every_format(reply):
    assert facts.fact_stated("live_price", 199.0, reply) is True


def test_number_fact_not_stated_by_other_numbers():
    assert facts.fact_stated("live_price", 199, "1990元，19.9元") is False


def test_discount_and_chinese_numerals():
    assert facts.fact_stated("discount", 0.85, "现在85折") is True
    assert facts.chinese_numbers_in("三到五天送达，十二件，一起看") == [3, 5, 12]
    assert facts.fact_stated("days_min", 3, "三到五天送达") is True


def test_string_facts_whole_words_ranges_and_synonyms():
    assert facts.fact_stated("recommended_size", "L", "建议XL码") is False
    assert facts.fact_stated("recommended_size", "L", "建议L码") is True
    assert facts.fact_stated("material", "纯棉", "这款是纯 棉的") is True
    assert facts.fact_stated("days", "3-5", "3到5天") is True
    assert facts.fact_stated("full_reduction", "满300减30", "满300元减30元") is True
    assert facts.fact_stated("fee", "包邮", "免运费哦") is True
    assert facts.fact_stated("fee", "包邮", "这款不包邮") is False


def test_zero_fee_and_zero_stock_stated_by_phrases():
    assert facts.fact_stated("fee", 0.0, "包邮哦") is True
    assert facts.fact_stated("stock", 0, "已经售罄啦") is True


def test_bool_facts_need_a_phrase_rule():
    assert facts.fact_stated("in_stock", True, "有货哦") is True
    assert facts.fact_stated("in_stock", False, "已售罄") is True
    assert facts.fact_stated("free_shipping", True, "不包邮") is False
    assert facts.fact_stated("free_return_insurance", False, "无运费险") is True
    assert facts.fact_stated("free_return_insurance", True, "无运费险") is False
    assert facts.fact_stated("gift", True, "送礼品") is None


def test_unsupported_fact_type_names_the_key():
    with pytest.raises(TypeError, match="gold_facts\\['sizes'\\]"):
        facts.fact_stated("sizes", ["S", "M"], "S")


def test_numbers_and_strings_of_nested_results():
    result = {"sku": "P0001-黑色-M", "stock": 12, "ok": True, "rows": [{"h": "150-160"}]}
    assert facts.numbers_of_value(result) == [1.0, 12.0, 150.0, 160.0]
    assert facts.strings_of_value(result) == ["P0001-黑色-M", "150-160"]
    assert facts.fact_in_results(12, [result]) and facts.fact_in_results("黑色", [result])
    assert not facts.fact_in_results(True, [result])


def test_ungrounded_numbers_use_fraction_readings():
    assert facts.ungrounded_numbers("打8折，到手199，送20元券", [0.8, 199.0]) == [20.0]


def test_wrong_facts_per_class_with_two_gold_prices():
    gold = {"live_price_1": 199.0, "live_price_2": 129.0}
    assert facts.wrong_facts("A只要199元，B只要129元", gold) == []
    assert facts.wrong_facts("A到手价189元", gold) == ["price: 189 (gold 199.0, 129.0)"]


def test_wrong_facts_cues_for_stock_days_size_fee():
    assert facts.wrong_facts("库存还剩20件", {"stock": 12}) == ["stock: 20 (gold 12)"]
    assert facts.wrong_facts("1-2天就能送到", {"days_min": 3, "days_max": 5}) == ["ship_days: 2 (gold 3, 5)"]
    assert facts.wrong_facts("建议选L码", {"recommended_size": "M"}) == ["size: L (gold M)"]
    assert facts.wrong_facts("运费10元", {"fee": "包邮"}) == ["fee: 10 (gold 包邮)"]
    assert facts.wrong_facts("原价299，到手价199", {"live_price": 199.0}) == []  # no list-price gold: unchecked
    assert facts.wrong_facts("材质是头层牛皮", {"material": "PP"}) == ["material: 头层牛皮 (gold PP)"]
    assert facts.wrong_facts("面料是纯棉的哦，面料舒服", {"material": "纯棉"}) == []
    assert facts.wrong_facts("产地是福建泉州", {"origin": "山东青岛"}) == ["origin: 福建泉州 (gold 山东青岛)"]


def test_fact_class_skips_derived_keys():
    assert facts.fact_class("price_diff") is None
    assert facts.fact_class("coupon_threshold") is None
    assert facts.fact_class("list_price") == "list_price"
    assert facts.fact_class("days_max") == "ship_days"
    assert facts.fact_class("return_days") == "return_days"
