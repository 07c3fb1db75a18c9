"""Small fake worlds for the pretraining corpus's generic tool-use chats (no live-stream data).

Five domains (weather, recipes, library, trains, unit conversion), three intents each. An intent is
one tool concept: a description (English and Chinese), canonical arguments, question templates, a
function over the domain's world, and an answer template that copies the result. `corpus.py` gives
the tools random surface names; the world is rebuilt per chat from the chat's random source.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

Lang = str  # "en" | "zh"
World = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Arg:
    """One canonical argument: JSON type and description per language; enum values per language."""

    name: str
    type: str
    desc: dict[Lang, str]
    enum: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Intent:
    """One tool concept of a domain."""

    name: str
    desc: dict[Lang, str]
    gist: dict[Lang, str]
    args: tuple[Arg, ...]
    questions: dict[Lang, tuple[str, ...]]
    sample_args: Callable[[World, random.Random, Lang], dict[str, Any]]
    run: Callable[[World, dict[str, Any], Lang], dict[str, Any]]
    answer_templates: dict[Lang, str]

    def answer(self, values: dict[str, Any], result: dict[str, Any], lang: Lang) -> str:
        """The final answer: the template filled from the arguments and the tool result."""
        return self.answer_templates[lang].format(**values, **result)


@dataclasses.dataclass(frozen=True)
class Domain:
    title: dict[Lang, str]
    make_world: Callable[[random.Random], World]
    intents: tuple[Intent, ...]


def _pairs(*items: str) -> list[tuple[str, str]]:
    """'english|中文' strings -> [(english, 中文)]."""
    return [tuple(item.split("|")) for item in items]  # type: ignore[misc]


CITIES = _pairs(
    "Oslo|奥斯陆", "Lima|利马", "Cairo|开罗", "Osaka|大阪", "Denver|丹佛", "Madrid|马德里", "Hanoi|河内", "Perth|珀斯"
)
DAYS = _pairs(
    "Monday|周一", "Tuesday|周二", "Wednesday|周三", "Thursday|周四", "Friday|周五", "Saturday|周六", "Sunday|周日"
)
CONDITIONS = _pairs("sunny|晴", "light rain|小雨", "cloudy|多云", "windy|大风", "snow|小雪", "foggy|有雾")
LEVELS = _pairs("good|良好", "moderate|中等", "poor|较差")
DISHES = _pairs(
    "tomato soup|番茄汤",
    "fried rice|炒饭",
    "pancakes|松饼",
    "lentil curry|扁豆咖喱",
    "apple pie|苹果派",
    "noodle salad|凉拌面",
)
FOODS = _pairs(
    "tomato|番茄",
    "onion|洋葱",
    "rice|米饭",
    "egg|鸡蛋",
    "flour|面粉",
    "milk|牛奶",
    "apple|苹果",
    "lentils|扁豆",
    "garlic|大蒜",
    "noodles|面条",
)
BOOKS = _pairs(
    "The Silent Harbor|静默港湾",
    "Paper Moons|纸月亮",
    "The Last Orchard|最后的果园",
    "North of Noon|正午以北",
    "Glass Rivers|玻璃河",
    "The Clockmaker|钟表匠",
)
AUTHORS = _pairs(
    "Mara Lind|玛拉·林德",
    "Tomas Reyes|托马斯·雷耶斯",
    "Ada Brook|艾达·布鲁克",
    "Ken Ito|伊藤健",
    "Lena Holt|莉娜·霍尔特",
)
STATIONS = _pairs("Berlin|柏林", "Vienna|维也纳", "Lyon|里昂", "Milan|米兰", "Porto|波尔图", "Krakow|克拉科夫")
CLASSES = _pairs("first|一等座", "second|二等座")


def _idx(lang: Lang) -> int:
    return 0 if lang == "en" else 1


def _find(pairs: list[tuple[str, str]], value: str) -> int:
    """Index of a displayed value in a bilingual list."""
    return next(i for i, pair in enumerate(pairs) if value in pair)


def _pick(pairs: list[tuple[str, str]], rng: random.Random, lang: Lang) -> str:
    return rng.choice(pairs)[_idx(lang)]


def _weather_world(rng: random.Random) -> World:
    return {
        "forecast": [[(rng.randrange(len(CONDITIONS)), rng.randint(-5, 34)) for _ in DAYS] for _ in CITIES],
        "aqi": [rng.randint(10, 180) for _ in CITIES],
        "sunrise": [f"0{rng.randint(5, 7)}:{rng.randint(0, 59):02d}" for _ in CITIES],
    }


def _a(name: str, en: str, zh: str, kind: str = "string", enum: tuple[str, ...] = ()) -> Arg:
    return Arg(name, kind, {"en": en, "zh": zh}, enum)


_CITY = _a("city", "The city name.", "城市名称。")
_DISH = _a("dish", "The dish name.", "菜名。")
_TITLE = _a("title", "The book title.", "书名。")
_ORIGIN = _a("origin", "The departure station.", "出发站。")
_DEST = _a("destination", "The arrival station.", "到达站。")

WEATHER = Domain(
    {"en": "weather questions", "zh": "天气查询"},
    _weather_world,
    (
        Intent(
            "forecast",
            {"en": "Returns the weather forecast for a city on a given day.", "zh": "查询某城市某一天的天气预报。"},
            {"en": "a weather forecast", "zh": "天气预报"},
            (_CITY, _a("day", "The day of the week.", "星期几。")),
            {
                "en": ("What will the weather be like in {city} on {day}?", "Is it going to rain in {city} on {day}?"),
                "zh": ("{city}{day}天气怎么样?", "{day}{city}会下雨吗?"),
            },
            lambda w, r, lang: {"city": _pick(CITIES, r, lang), "day": _pick(DAYS, r, lang)},
            lambda w, v, lang: {
                "condition": CONDITIONS[w["forecast"][_find(CITIES, v["city"])][_find(DAYS, v["day"])][0]][_idx(lang)],
                "high_c": w["forecast"][_find(CITIES, v["city"])][_find(DAYS, v["day"])][1],
            },
            {
                "en": "On {day} {city} will be {condition} with a high of {high_c} °C.",
                "zh": "{city}{day}{condition},最高气温{high_c}°C。",
            },
        ),
        Intent(
            "air_quality",
            {"en": "Returns today's air quality index for a city.", "zh": "查询某城市今天的空气质量指数。"},
            {"en": "the air quality", "zh": "空气质量"},
            (_CITY,),
            {
                "en": ("How is the air quality in {city} today?", "Is the air clean in {city} today?"),
                "zh": ("{city}今天空气质量怎么样?",),
            },
            lambda w, r, lang: {"city": _pick(CITIES, r, lang)},
            lambda w, v, lang: {
                "aqi": w["aqi"][_find(CITIES, v["city"])],
                "level": LEVELS[min(2, w["aqi"][_find(CITIES, v["city"])] // 60)][_idx(lang)],
            },
            {
                "en": "The air quality index in {city} is {aqi} ({level}).",
                "zh": "{city}今天的空气质量指数是{aqi},{level}。",
            },
        ),
        Intent(
            "sunrise",
            {"en": "Returns tomorrow's sunrise time in a city.", "zh": "查询某城市明天的日出时间。"},
            {"en": "the sunrise time", "zh": "日出时间"},
            (_CITY,),
            {"en": ("When does the sun rise in {city} tomorrow?",), "zh": ("{city}明天几点日出?",)},
            lambda w, r, lang: {"city": _pick(CITIES, r, lang)},
            lambda w, v, lang: {"sunrise": w["sunrise"][_find(CITIES, v["city"])]},
            {"en": "Tomorrow the sun rises at {sunrise} in {city}.", "zh": "{city}明天的日出时间是{sunrise}。"},
        ),
    ),
)


def _recipe_world(rng: random.Random) -> World:
    return {
        "minutes": [rng.choice((15, 20, 25, 30, 40, 45, 60)) for _ in DISHES],
        "foods": [rng.sample(range(len(FOODS)), 3) for _ in DISHES],
        "kcal": [rng.randint(15, 60) * 10 for _ in DISHES],
    }


RECIPES = Domain(
    {"en": "cooking and recipes", "zh": "菜谱"},
    _recipe_world,
    (
        Intent(
            "cooking_time",
            {"en": "Returns how many minutes a dish takes to cook.", "zh": "查询一道菜需要烹饪多少分钟。"},
            {"en": "the cooking time", "zh": "烹饪时间"},
            (_DISH,),
            {"en": ("How long does it take to cook {dish}?",), "zh": ("做{dish}要多久?",)},
            lambda w, r, lang: {"dish": _pick(DISHES, r, lang)},
            lambda w, v, lang: {"minutes": w["minutes"][_find(DISHES, v["dish"])]},
            {"en": "Cooking {dish} takes about {minutes} minutes.", "zh": "做{dish}大约需要{minutes}分钟。"},
        ),
        Intent(
            "ingredients",
            {"en": "Lists the main ingredients of a dish.", "zh": "列出一道菜的主要食材。"},
            {"en": "the ingredients", "zh": "食材"},
            (_DISH,),
            {
                "en": ("What do I need to make {dish}?", "Which ingredients go into {dish}?"),
                "zh": ("做{dish}需要哪些食材?",),
            },
            lambda w, r, lang: {"dish": _pick(DISHES, r, lang)},
            lambda w, v, lang: {
                "ingredients": ("、" if lang == "zh" else ", ").join(
                    FOODS[i][_idx(lang)] for i in w["foods"][_find(DISHES, v["dish"])]
                )
            },
            {"en": "For {dish} you need {ingredients}.", "zh": "做{dish}需要{ingredients}。"},
        ),
        Intent(
            "calories",
            {"en": "Returns the calories in a number of servings of a dish.", "zh": "查询若干份某道菜的热量。"},
            {"en": "the calories", "zh": "热量"},
            (_DISH, _a("servings", "Number of servings.", "份数。", "integer")),
            {
                "en": ("How many calories are in {servings} servings of {dish}?",),
                "zh": ("{servings}份{dish}有多少热量?",),
            },
            lambda w, r, lang: {"dish": _pick(DISHES, r, lang), "servings": r.randint(1, 4)},
            lambda w, v, lang: {"calories": w["kcal"][_find(DISHES, v["dish"])] * v["servings"]},
            {
                "en": "{servings} servings of {dish} have about {calories} calories.",
                "zh": "{servings}份{dish}约有{calories}千卡。",
            },
        ),
    ),
)


def _library_world(rng: random.Random) -> World:
    return {
        "copies": [rng.randint(0, 5) for _ in BOOKS],
        "author": [rng.randrange(len(AUTHORS)) for _ in BOOKS],
        "due": [f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" for _ in BOOKS],
    }


LIBRARY = Domain(
    {"en": "the city library", "zh": "图书馆"},
    _library_world,
    (
        Intent(
            "availability",
            {"en": "Returns how many copies of a book can be borrowed now.", "zh": "查询一本书现在可借的册数。"},
            {"en": "whether a book is available", "zh": "书是否可借"},
            (_TITLE,),
            {
                "en": ("Can I borrow {title} today?", "Is {title} available at the library?"),
                "zh": ("《{title}》现在能借吗?",),
            },
            lambda w, r, lang: {"title": _pick(BOOKS, r, lang)},
            lambda w, v, lang: {"copies": w["copies"][_find(BOOKS, v["title"])]},
            {"en": "{copies} copies of {title} can be borrowed now.", "zh": "《{title}》现在可借{copies}册。"},
        ),
        Intent(
            "author",
            {"en": "Returns the author of a book.", "zh": "查询一本书的作者。"},
            {"en": "the author of a book", "zh": "书的作者"},
            (_TITLE,),
            {"en": ("Who wrote {title}?",), "zh": ("《{title}》的作者是谁?",)},
            lambda w, r, lang: {"title": _pick(BOOKS, r, lang)},
            lambda w, v, lang: {"author": AUTHORS[w["author"][_find(BOOKS, v["title"])]][_idx(lang)]},
            {"en": "{title} was written by {author}.", "zh": "《{title}》的作者是{author}。"},
        ),
        Intent(
            "due_date",
            {"en": "Returns the due date of a book on loan to a library card.", "zh": "查询某借书证所借图书的到期日。"},
            {"en": "a due date", "zh": "还书日期"},
            (_a("card_number", "The library card number.", "借书证号。"), _TITLE),
            {
                "en": ("My card is {card_number}. When is {title} due?",),
                "zh": ("我的借书证是{card_number},《{title}》什么时候到期?",),
            },
            lambda w, r, lang: {"card_number": f"C-{r.randint(10000, 99999)}", "title": _pick(BOOKS, r, lang)},
            lambda w, v, lang: {"due_date": w["due"][_find(BOOKS, v["title"])]},
            {"en": "{title} is due on {due_date}.", "zh": "《{title}》的到期日是{due_date}。"},
        ),
    ),
)


def _train_world(rng: random.Random) -> World:
    n = len(STATIONS)
    return {
        "departure": [
            [f"{rng.randint(6, 21):02d}:{rng.choice((0, 10, 20, 30, 40, 50)):02d}" for _ in range(n)] for _ in range(n)
        ],
        "platform": [[rng.randint(1, 12) for _ in range(n)] for _ in range(n)],
        "price": [[rng.randint(19, 99) for _ in range(n)] for _ in range(n)],
    }


def _route(rng: random.Random, lang: Lang) -> dict[str, Any]:
    a, b = rng.sample(STATIONS, 2)
    return {"origin": a[_idx(lang)], "destination": b[_idx(lang)]}


def _leg(w: World, key: str, v: dict[str, Any]) -> Any:
    return w[key][_find(STATIONS, v["origin"])][_find(STATIONS, v["destination"])]


TRAINS = Domain(
    {"en": "train travel", "zh": "火车出行"},
    _train_world,
    (
        Intent(
            "next_train",
            {
                "en": "Returns the next train between two stations and its platform.",
                "zh": "查询两站之间的下一班火车及站台。",
            },
            {"en": "the next train", "zh": "下一班火车"},
            (_ORIGIN, _DEST),
            {
                "en": ("When is the next train from {origin} to {destination}?",),
                "zh": ("从{origin}到{destination}的下一班车几点?",),
            },
            lambda w, r, lang: _route(r, lang),
            lambda w, v, lang: {"departure": _leg(w, "departure", v), "platform": _leg(w, "platform", v)},
            {
                "en": "The next train from {origin} to {destination} leaves at {departure} from platform {platform}.",
                "zh": "从{origin}到{destination}的下一班车{departure}发车,在{platform}号站台。",
            },
        ),
        Intent(
            "ticket_price",
            {
                "en": "Returns the ticket price in euros between two stations for a travel class.",
                "zh": "查询两站之间某座位等级的票价(欧元)。",
            },
            {"en": "a ticket price", "zh": "票价"},
            (_ORIGIN, _DEST, _a("travel_class", "The travel class.", "座位等级。")),
            {
                "en": ("How much is a {travel_class} class ticket from {origin} to {destination}?",),
                "zh": ("从{origin}到{destination}的{travel_class}多少钱?",),
            },
            lambda w, r, lang: {**_route(r, lang), "travel_class": _pick(CLASSES, r, lang)},
            lambda w, v, lang: {
                "price_eur": _leg(w, "price", v) * (2 if _find(CLASSES, v["travel_class"]) == 0 else 1)
            },
            {
                "en": "A {travel_class} class ticket from {origin} to {destination} costs {price_eur} euros.",
                "zh": "从{origin}到{destination}的{travel_class}票价是{price_eur}欧元。",
            },
        ),
        Intent(
            "seats_left",
            {"en": "Returns how many seats are left on a train.", "zh": "查询某车次剩余座位数。"},
            {"en": "the seats left", "zh": "剩余座位"},
            (_a("train_number", "The train number.", "车次。"),),
            {"en": ("How many seats are left on train {train_number}?",), "zh": ("{train_number}次列车还有多少座位?",)},
            lambda w, r, lang: {"train_number": f"IC{r.randint(100, 999)}"},
            lambda w, v, lang: {"seats_left": int(v["train_number"][2:]) % 97},
            {
                "en": "Train {train_number} has {seats_left} seats left.",
                "zh": "{train_number}次列车还剩{seats_left}个座位。",
            },
        ),
    ),
)

UNITS = Domain(
    {"en": "unit conversion", "zh": "单位换算"},
    lambda rng: {},
    (
        Intent(
            "km_to_miles",
            {"en": "Converts a distance in kilometres to miles.", "zh": "把公里换算成英里。"},
            {"en": "a distance in miles", "zh": "英里数"},
            (_a("km", "Distance in kilometres.", "公里数。", "number"),),
            {"en": ("How many miles is {km} km?",), "zh": ("{km}公里是多少英里?",)},
            lambda w, r, lang: {"km": r.randint(1, 500)},
            lambda w, v, lang: {"miles": round(v["km"] * 0.621371, 1)},
            {"en": "{km} km is {miles} miles.", "zh": "{km}公里约等于{miles}英里。"},
        ),
        Intent(
            "celsius_to_fahrenheit",
            {"en": "Converts a temperature in Celsius to Fahrenheit.", "zh": "把摄氏度换算成华氏度。"},
            {"en": "a temperature in Fahrenheit", "zh": "华氏温度"},
            (_a("celsius", "Temperature in degrees Celsius.", "摄氏温度。", "number"),),
            {"en": ("What is {celsius} °C in Fahrenheit?",), "zh": ("{celsius}摄氏度是多少华氏度?",)},
            lambda w, r, lang: {"celsius": r.randint(-20, 40)},
            lambda w, v, lang: {"fahrenheit": round(v["celsius"] * 9 / 5 + 32, 1)},
            {"en": "{celsius} °C is {fahrenheit} °F.", "zh": "{celsius}摄氏度等于{fahrenheit}华氏度。"},
        ),
        Intent(
            "kg_to_pounds",
            {"en": "Converts a weight in kilograms to pounds.", "zh": "把千克换算成磅。"},
            {"en": "a weight in pounds", "zh": "磅数"},
            (_a("kg", "Weight in kilograms.", "千克数。", "number"),),
            {"en": ("How many pounds is {kg} kg?",), "zh": ("{kg}千克是多少磅?",)},
            lambda w, r, lang: {"kg": r.randint(1, 120)},
            lambda w, v, lang: {"pounds": round(v["kg"] * 2.20462, 1)},
            {"en": "{kg} kg is {pounds} pounds.", "zh": "{kg}千克约等于{pounds}磅。"},
        ),
    ),
)

DOMAINS: tuple[Domain, ...] = (WEATHER, RECIPES, LIBRARY, TRAINS, UNITS)
