"""The math corpus's problem templates (:mod:`lit_domino.data.corpora.math`): entities, the exact arithmetic of a
step (:func:`eq`) and one function per GSM8K-style problem shape, each drawing its names and numbers."""

from __future__ import annotations

import random
from collections.abc import Callable


# (name, subject pronoun, possessive)
NAMES = [
    ("Tom", "he", "his"), ("Mia", "she", "her"), ("Sam", "he", "his"), ("Lily", "she", "her"),
    ("Ben", "he", "his"), ("Emma", "she", "her"), ("Jack", "he", "his"), ("Zoe", "she", "her"),
    ("Leo", "he", "his"), ("Ava", "she", "her"), ("Noah", "he", "his"), ("Ella", "she", "her"),
    ("Omar", "he", "his"), ("Nina", "she", "her"), ("Ravi", "he", "his"), ("Sara", "she", "her"),
    ("Luis", "he", "his"), ("Hana", "she", "her"), ("Ivan", "he", "his"), ("Maya", "she", "her"),
    ("Eli", "he", "his"), ("Rosa", "she", "her"), ("Kofi", "he", "his"), ("Amy", "she", "her"),
    ("Max", "he", "his"), ("Lucy", "she", "her"), ("Dan", "he", "his"), ("Ines", "she", "her"),
    ("Paul", "he", "his"), ("Yuki", "she", "her"), ("Adam", "he", "his"), ("Chloe", "she", "her"),
]
OBJECTS = [
    "apples", "pencils", "stickers", "marbles", "books", "cards", "balloons", "shells",
    "stamps", "toy cars", "crayons", "oranges", "eggs", "flowers", "beads", "coins",
    "buttons", "candies", "rocks", "comics", "erasers", "ribbons", "pens", "plums",
]
FOODS = ["cookies", "muffins", "cupcakes", "pancakes", "brownies", "rolls", "tarts", "pies"]
ITEMS = ["notebooks", "toys", "sandwiches", "tickets", "mugs", "kites", "hats", "puzzles", "scarves", "plants"]
THINGS_TO_BUY = ["bike", "game", "jacket", "camera", "guitar", "watch", "lamp", "backpack"]
SHOPS = ["store", "bakery", "market", "shop", "stand", "kiosk"]
VEHICLES = ["car", "bus", "train", "truck", "van", "boat"]
SUPPLIES = ["markers", "glue sticks", "rulers", "scissors", "notebooks", "folders"]
ANIMALS = ["horse", "cow", "goat", "pony", "donkey", "camel"]
PLANTS = ["tomato plants", "rose bushes", "carrots", "sunflowers", "pepper plants", "tulips"]


def eq(a: int, op: str, b: int) -> tuple[str, int]:
    """``("a op b = c", c)``; division must be exact."""
    if op == "+":
        c = a + b
    elif op == "-":
        c = a - b
    elif op == "*":
        c = a * b
    elif op == "/":
        if b == 0 or a % b:
            raise ValueError(f"{a} / {b} is not exact")
        c = a // b
    else:
        raise ValueError(f"unknown operator {op!r}")
    return f"{a} {op} {b} = {c}", c


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


class Draw:
    """Entity and number choices of one problem, from the caller's rng."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def person(self, *others: str) -> tuple[str, str, str]:
        while True:
            p = self.rng.choice(NAMES)
            if p[0] not in others:
                return p

    def pick(self, options):
        return self.rng.choice(options)

    def num(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


# A template takes a Draw and returns (question, solution steps, answer, numbers),
# or None when the drawn numbers break a constraint (the caller draws again).
Template = Callable[[Draw], "tuple[str, list[str], int, tuple[int, ...]] | None"]


def t_buy_give(d: Draw):
    n, he, _ = d.person()
    f = d.person(n)[0]
    obj = d.pick(OBJECTS)
    a, b = d.num(5, 60), d.num(2, 30)
    s1, s = eq(a, "+", b)
    c = d.num(2, s - 1)
    s2, r = eq(s, "-", c)
    q = d.pick([
        f"{n} has {a} {obj}. {_cap(he)} buys {b} more and then gives {c} to {f}. How many {obj} does {n} have now?",
        f"{n} had {a} {obj}. At the {d.pick(SHOPS)} {he} got {b} more. Later {he} gave {f} {c} of them. How many {obj} does {n} have left?",
        f"There are {a} {obj} in {n}'s bag. {n} adds {b} more, then {f} takes {c}. How many {obj} are in the bag now?",
    ])
    steps = [f"After buying more, {n} has {s1} {obj}.", f"After giving some away, {n} has {s2} {obj}."]
    return q, steps, r, (a, b, c)


def t_packs_use(d: Draw):
    n, he, _ = d.person()
    obj = d.pick(OBJECTS)
    a, b = d.num(2, 9), d.num(2, 12)
    s1, t = eq(a, "*", b)
    c = d.num(1, t - 1)
    s2, r = eq(t, "-", c)
    q = d.pick([
        f"{n} buys {a} packs of {obj}. Each pack has {b} {obj}. {_cap(he)} uses {c} of them. How many {obj} are left?",
        f"A pack holds {b} {obj}. {n} opens {a} packs and gives away {c} {obj}. How many {obj} does {n} still have?",
    ])
    steps = [f"{n} buys {s1} {obj}.", f"{n} has {s2} {obj} left."]
    return q, steps, r, (a, b, c)


def t_share_more(d: Draw):
    n, _, _ = d.person()
    f = d.person(n)[0]
    obj = d.pick(OBJECTS)
    per, b, c = d.num(2, 15), d.num(2, 9), d.num(1, 20)
    a = per * b
    s1, q1 = eq(a, "/", b)
    s2, r = eq(q1, "+", c)
    q = d.pick([
        f"{n} shares {a} {obj} equally among {b} friends. Then {f} gives each friend {c} more {obj}. How many {obj} does each friend have?",
        f"{a} {obj} are split evenly between {b} children. Each child then gets {c} more from {f}. How many {obj} does each child have now?",
    ])
    steps = [f"At first each one gets {s1} {obj}.", f"Then each one has {s2} {obj}."]
    return q, steps, r, (a, b, c)


def t_change(d: Draw):
    n, he, _ = d.person()
    item, thing = d.pick(ITEMS), d.pick(["bag", "card", "pen", "snack"])
    a, b, c = d.num(2, 9), d.num(2, 12), d.num(1, 20)
    s1, t = eq(a, "*", b)
    s2, total = eq(t, "+", c)
    bill = next((x for x in (20, 50, 100) if x > total), None)
    if bill is None:
        return None
    s3, r = eq(bill, "-", total)
    q = d.pick([
        f"{n} buys {a} {item} at ${b} each and a {thing} for ${c}. {_cap(he)} pays with a ${bill} bill. How much change does {he} get?",
        f"{item.capitalize()} cost ${b} each. {n} buys {a} of them and a ${c} {thing}, and hands the cashier ${bill}. How many dollars of change does {n} get back?",
    ])
    steps = [f"The {item} cost {s1} dollars.", f"With the {thing}, {n} spends {s2} dollars.", f"The change is {s3} dollars."]
    return q, steps, r, (a, b, c, bill)


def t_distance(d: Draw):
    veh = d.pick(VEHICLES)
    a, b, c = d.num(10, 60), d.num(2, 6), d.num(5, 60)
    s1, x = eq(a, "*", b)
    s2, r = eq(x, "+", c)
    if r >= 1000:
        return None
    q = d.pick([
        f"A {veh} travels {a} miles per hour for {b} hours, then goes {c} more miles. How many miles does it travel in total?",
        f"A {veh} drives at {a} miles an hour for {b} hours. After a stop it drives another {c} miles. What is the total distance in miles?",
    ])
    steps = [f"In {b} hours the {veh} travels {s1} miles.", f"The total distance is {s2} miles."]
    return q, steps, r, (a, b, c)


def t_savings(d: Draw):
    n, he, _ = d.person()
    thing = d.pick(THINGS_TO_BUY)
    a, b = d.num(3, 25), d.num(2, 10)
    s1, t = eq(a, "*", b)
    c = d.num(1, t - 1)
    s2, r = eq(t, "-", c)
    q = d.pick([
        f"{n} saves ${a} every week for {b} weeks. Then {he} spends ${c} on a {thing}. How many dollars does {n} have left?",
        f"Every week {n} puts ${a} in a piggy bank. After {b} weeks {he} buys a {thing} for ${c}. How much money is left?",
    ])
    steps = [f"{n} saves {s1} dollars.", f"After buying the {thing}, {n} has {s2} dollars left."]
    return q, steps, r, (a, b, c)


def t_groups_supplies(d: Draw):
    sup = d.pick(SUPPLIES)
    g, b, c = d.num(2, 9), d.num(2, 8), d.num(2, 9)
    a = g * b
    s1, _ = eq(a, "/", b)
    s2, r = eq(g, "*", c)
    q = d.pick([
        f"There are {a} students in a class. They work in groups of {b}. Each group needs {c} {sup}. How many {sup} does the class need?",
        f"A teacher splits {a} students into groups of {b}, and gives every group {c} {sup}. How many {sup} does the teacher hand out?",
    ])
    steps = [f"There are {s1} groups.", f"The class needs {s2} {sup}."]
    return q, steps, r, (a, b, c)


def t_lose_two_days(d: Draw):
    n, he, _ = d.person()
    obj = d.pick(OBJECTS)
    a = d.num(20, 99)
    b = d.num(1, a // 2)
    s1, x = eq(a, "-", b)
    c = d.num(1, x - 1)
    s2, r = eq(x, "-", c)
    q = d.pick([
        f"{n} had {a} {obj}. {_cap(he)} lost {b} on Monday and {c} on Tuesday. How many {obj} does {n} have left?",
        f"On Sunday {n} owned {a} {obj}. {_cap(he)} lost {b} of them on Monday and another {c} on Tuesday. How many are left?",
    ])
    steps = [f"After Monday, {n} has {s1} {obj}.", f"After Tuesday, {n} has {s2} {obj}."]
    return q, steps, r, (a, b, c)


def t_sell_twice(d: Draw):
    shop, obj = d.pick(SHOPS), d.pick(FOODS)
    b = d.num(2, 30)
    s1, s = eq(b, "*", 2)
    s2, t = eq(b, "+", s)
    a = d.num(t + 1, t + 60)
    s3, r = eq(a, "-", t)
    q = d.pick([
        f"A {shop} had {a} {obj}. It sold {b} in the morning and twice as many in the afternoon. How many {obj} are left?",
        f"A {shop} baked {a} {obj}. In the morning {b} were sold, and in the afternoon twice that many. How many {obj} were not sold?",
    ])
    steps = [f"In the afternoon it sold {s1} {obj}.", f"In total it sold {s2} {obj}.", f"It has {s3} {obj} left."]
    return q, steps, r, (a, b)


def t_more_together(d: Draw):
    n1 = d.person()[0]
    n2 = d.person(n1)[0]
    obj = d.pick(OBJECTS)
    a, b = d.num(3, 60), d.num(2, 30)
    s1, x = eq(a, "+", b)
    s2, r = eq(a, "+", x)
    q = d.pick([
        f"{n1} has {a} {obj}. {n2} has {b} more {obj} than {n1}. How many {obj} do they have together?",
        f"{n2} collected {b} more {obj} than {n1}, who collected {a}. How many {obj} did the two collect in all?",
    ])
    steps = [f"{n2} has {s1} {obj}.", f"Together they have {s2} {obj}."]
    return q, steps, r, (a, b)


def t_times_fewer(d: Draw):
    n1 = d.person()[0]
    n2 = d.person(n1)[0]
    n3 = d.person(n1, n2)[0]
    obj = d.pick(OBJECTS)
    a, k = d.num(2, 12), d.num(2, 5)
    s1, x = eq(a, "*", k)
    c = d.num(1, x - 1)
    s2, r = eq(x, "-", c)
    q = d.pick([
        f"{n1} has {a} {obj}. {n2} has {k} times as many {obj} as {n1}. {n3} has {c} fewer {obj} than {n2}. How many {obj} does {n3} have?",
        f"{n2} owns {k} times as many {obj} as {n1}, who owns {a}. {n3} owns {c} fewer than {n2}. How many {obj} does {n3} own?",
    ])
    steps = [f"{n2} has {s1} {obj}.", f"{n3} has {s2} {obj}."]
    return q, steps, r, (a, k, c)


def t_reading(d: Draw):
    n, he, _ = d.person()
    a, b = d.num(3, 25), d.num(2, 9)
    s1, t = eq(a, "*", b)
    c = d.num(t + 1, min(t + 200, 999))
    s2, r = eq(c, "-", t)
    q = d.pick([
        f"{n} reads {a} pages every day. {_cap(he)} has a book with {c} pages. How many pages are left after {b} days?",
        f"A book has {c} pages. {n} reads {a} pages a day for {b} days. How many pages does {n} still have to read?",
    ])
    steps = [f"In {b} days {n} reads {s1} pages.", f"There are {s2} pages left."]
    return q, steps, r, (a, b, c)


def t_weekday_minutes(d: Draw):
    n, he, _ = d.person()
    task = d.pick(["homework", "the piano", "reading", "running", "drawing"])
    a, b = d.num(10, 60), d.num(10, 90)
    s1, t = eq(a, "*", 5)
    s2, r = eq(t, "+", b)
    q = d.pick([
        f"{n} spends {a} minutes on {task} each day from Monday to Friday and {b} minutes on Saturday. How many minutes does {he} spend on {task} in total?",
        f"On each of the 5 school days {n} spends {a} minutes on {task}. On Saturday {he} spends {b} minutes. How many minutes is that in all?",
    ])
    steps = [f"On school days {n} spends {s1} minutes.", f"In total {n} spends {s2} minutes."]
    return q, steps, r, (a, b)


def t_bake_half(d: Draw):
    n, he, _ = d.person()
    f = d.person(n)[0]
    food = d.pick(FOODS)
    a, b = d.num(10, 80), d.num(1, 9)
    s1, x = eq(a, "-", b)
    if x % 2:
        return None
    s2, h = eq(x, "/", 2)
    s3, k = eq(x, "-", h)
    q = d.pick([
        f"{n} baked {a} {food}. {_cap(he)} ate {b} and gave half of the rest to {f}. How many {food} does {n} keep?",
        f"There were {a} {food} on a tray. {n} ate {b} of them, then gave half of what was left to {f}. How many {food} are left for {n}?",
    ])
    steps = [f"After eating, {n} has {s1} {food}.", f"{n} gives away {s2} {food}.", f"{n} keeps {s3} {food}."]
    return q, steps, k, (a, b)


def t_garden_rows(d: Draw):
    n, _, _ = d.person()
    plant = d.pick(PLANTS)
    a, b = d.num(2, 12), d.num(2, 15)
    s1, t = eq(a, "*", b)
    c = d.num(1, t - 1)
    s2, r = eq(t, "-", c)
    q = d.pick([
        f"{n}'s garden has {a} rows of {plant} with {b} in each row. {c} of them die. How many {plant} are still alive?",
        f"{n} plants {a} rows of {plant}, {b} in every row. Later {c} are eaten by rabbits. How many {plant} are left?",
    ])
    steps = [f"{n} planted {s1} {plant}.", f"There are {s2} {plant} left."]
    return q, steps, r, (a, b, c)


def t_buckets(d: Draw):
    n, he, _ = d.person()
    a, b = d.num(2, 20), d.num(2, 9)
    s1, t = eq(a, "*", b)
    c = d.num(1, t - 1)
    s2, r = eq(t, "-", c)
    q = d.pick([
        f"{n} pours {b} buckets of water into a tank. Each bucket holds {a} liters. {_cap(he)} spills {c} liters. How many liters end up in the tank?",
        f"A bucket holds {a} liters. {n} carries {b} full buckets to a pool but spills {c} liters on the way. How many liters reach the pool?",
    ])
    steps = [f"The buckets hold {s1} liters.", f"After spilling, {s2} liters are left."]
    return q, steps, r, (a, b, c)


def t_age(d: Draw):
    n, _, his = d.person()
    rel = d.pick(["brother", "sister", "cousin", "uncle", "aunt"])
    a, b, c = d.num(5, 40), d.num(2, 15), d.num(2, 20)
    s1, x = eq(a, "+", b)
    s2, r = eq(x, "+", c)
    q = d.pick([
        f"{n} is {a} years old. {_cap(his)} {rel} is {b} years older. How old will the {rel} be in {c} years?",
        f"{n}'s {rel} is {b} years older than {n}, who is {a}. How old will the {rel} be {c} years from now?",
    ])
    steps = [f"The {rel} is {s1} years old.", f"In {c} years the {rel} will be {s2} years old."]
    return q, steps, r, (a, b, c)


def t_split_bill(d: Draw):
    k, e = d.num(2, 6), d.num(3, 30)
    b, c = d.num(2, 6), d.num(2, 5)
    t = e * k
    s1, dr = eq(b, "*", c)
    a = t - dr
    if a < 5:
        return None
    s2, _ = eq(a, "+", dr)
    s3, r = eq(t, "/", k)
    food = d.pick(["pizza", "cake", "picnic basket", "pie"])
    q = d.pick([
        f"{k} friends buy a {food} for ${a} and {b} drinks at ${c} each. They split the cost equally. How many dollars does each friend pay?",
        f"A group of {k} friends pays ${a} for a {food} and buys {b} drinks that cost ${c} each. If they share the bill equally, how much does each pay?",
    ])
    steps = [f"The drinks cost {s1} dollars.", f"The total is {s2} dollars.", f"Each friend pays {s3} dollars."]
    return q, steps, r, (k, a, b, c)


def t_wages(d: Draw):
    n, he, _ = d.person()
    a, b, c = d.num(5, 20), d.num(2, 8), d.num(2, 8)
    s1, h = eq(b, "+", c)
    s2, r = eq(a, "*", h)
    q = d.pick([
        f"{n} earns ${a} per hour. {_cap(he)} works {b} hours on Saturday and {c} hours on Sunday. How many dollars does {n} earn?",
        f"{n} is paid ${a} an hour. Last weekend {he} worked {b} hours on Saturday and {c} on Sunday. How much did {he} earn?",
    ])
    steps = [f"{n} works {s1} hours.", f"{n} earns {s2} dollars."]
    return q, steps, r, (a, b, c)


def t_boxes_take(d: Draw):
    n, he, _ = d.person()
    obj = d.pick(OBJECTS)
    per, b = d.num(3, 20), d.num(2, 9)
    a = per * b
    s1, q1 = eq(a, "/", b)
    c = d.num(1, q1 - 1)
    s2, r = eq(q1, "-", c)
    q = d.pick([
        f"{n} puts {a} {obj} equally into {b} boxes. Then {he} takes {c} {obj} out of one box. How many {obj} are in that box now?",
        f"{a} {obj} are packed evenly into {b} boxes. {n} removes {c} from one of the boxes. How many {obj} does that box hold now?",
    ])
    steps = [f"Each box gets {s1} {obj}.", f"That box now has {s2} {obj}."]
    return q, steps, r, (a, b, c)


def t_bus(d: Draw):
    veh = d.pick(["bus", "train", "tram", "ferry"])
    a = d.num(5, 60)
    b = d.num(2, a - 2)
    c = d.num(2, 30)
    s1, x = eq(a, "-", b)
    s2, r = eq(x, "+", c)
    q = d.pick([
        f"A {veh} has {a} passengers. At the first stop {b} people get off and {c} people get on. How many passengers are on the {veh} now?",
        f"There are {a} people on a {veh}. {b} of them leave at the next stop, and {c} new passengers board. How many people are on the {veh}?",
    ])
    steps = [f"After {b} get off, there are {s1} passengers.", f"After {c} get on, there are {s2} passengers."]
    return q, steps, r, (a, b, c)


def t_tickets(d: Draw):
    n, he, _ = d.person()
    place = d.pick(["zoo", "museum", "cinema", "circus", "aquarium"])
    a, b, k = d.num(5, 20), d.num(2, 12), d.num(2, 6)
    s1, x = eq(a, "*", 2)
    s2, y = eq(b, "*", k)
    s3, r = eq(x, "+", y)
    q = d.pick([
        f"At the {place}, adult tickets cost ${a} and child tickets cost ${b}. {n} buys 2 adult tickets and {k} child tickets. How many dollars does {he} spend?",
        f"A {place} charges ${a} per adult and ${b} per child. How much does a visit cost for 2 adults and {k} children?",
    ])
    steps = [f"The adult tickets cost {s1} dollars.", f"The child tickets cost {s2} dollars.", f"The total is {s3} dollars."]
    return q, steps, r, (a, b, k)


def t_weeks_food(d: Draw):
    animal = d.pick(ANIMALS)
    a, b, c = d.num(2, 12), d.num(2, 8), d.num(2, 5)
    s1, daily = eq(a, "+", b)
    s2, days = eq(c, "*", 7)
    s3, r = eq(daily, "*", days)
    if r >= 1000:
        return None
    q = d.pick([
        f"A {animal} eats {a} kilograms of hay and {b} kilograms of oats every day. How many kilograms of food does it eat in {c} weeks?",
        f"Every day a farmer feeds a {animal} {a} kilograms of hay and {b} kilograms of oats. How many kilograms of food are needed for {c} weeks?",
    ])
    steps = [f"Each day the {animal} eats {s1} kilograms.", f"{c} weeks have {s2} days.", f"The {animal} eats {s3} kilograms."]
    return q, steps, r, (a, b, c)


def t_quarter_more(d: Draw):
    n, he, _ = d.person()
    food = d.pick(FOODS)
    a, b = 4 * d.num(3, 24), d.num(1, 30)
    s1, q1 = eq(a, "/", 4)
    s2, x = eq(a, "-", q1)
    s3, r = eq(x, "+", b)
    q = d.pick([
        f"There are {a} {food} in a box. {n} eats a quarter of them and then bakes {b} more. How many {food} are in the box now?",
        f"A box holds {a} {food}. A quarter of them are eaten, and then {n} adds {b} new {food}. How many {food} does the box hold?",
    ])
    steps = [f"A quarter is {s1} {food}.", f"Then {s2} {food} are left.", f"After adding more, there are {s3} {food}."]
    return q, steps, r, (a, b)


def t_stamps_pages(d: Draw):
    n, he, _ = d.person()
    obj = d.pick(["stamps", "photos", "stickers", "cards"])
    a, b, c = d.num(2, 12), d.num(3, 12), d.num(1, 40)
    s1, x = eq(a, "*", b)
    s2, r = eq(x, "+", c)
    q = d.pick([
        f"{n}'s album has {a} full pages with {b} {obj} on each page, and {c} loose {obj}. How many {obj} does {n} have?",
        f"{n} fills {a} pages of an album with {b} {obj} per page. {_cap(he)} has {c} more {obj} that do not fit. How many {obj} are there in all?",
    ])
    steps = [f"The pages hold {s1} {obj}.", f"In all there are {s2} {obj}."]
    return q, steps, r, (a, b, c)


TEMPLATES: dict[str, Template] = {
    fn.__name__[2:]: fn
    for fn in (
        t_buy_give, t_packs_use, t_share_more, t_change, t_distance, t_savings, t_groups_supplies,
        t_lose_two_days, t_sell_twice, t_more_together, t_times_fewer, t_reading, t_weekday_minutes,
        t_bake_half, t_garden_rows, t_buckets, t_age, t_split_bill, t_wages, t_boxes_take, t_bus,
        t_tickets, t_weeks_food, t_quarter_more, t_stamps_pages,
    )
}
