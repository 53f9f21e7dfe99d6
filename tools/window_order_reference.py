"""Independent reference for rt::window_order (src/data/dataset.cpp).

Pure-Python mt19937_64 (the constants of the C++ standard, [rand.predef]),
splitmix64 seeding, Lemire's bounded draw and Fisher-Yates, written from the
algorithms' definitions. Prints the permutations that
tests/data/dataset_test.cpp pins, so the C++ order is checked against a second
implementation and stays the same on every standard library.
Run: python3 tools/window_order_reference.py
"""

MASK = (1 << 64) - 1


class MT19937_64:
    n, m = 312, 156
    a = 0xB5026F5AA96619E9
    upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF

    def __init__(self, seed):
        self.mt = [seed & MASK]
        for i in range(1, self.n):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK)
        self.i = self.n

    def __call__(self):
        if self.i >= self.n:
            mt = self.mt
            for k in range(self.n):
                y = (mt[k] & self.upper) | (mt[(k + 1) % self.n] & self.lower)
                mt[k] = mt[(k + self.m) % self.n] ^ (y >> 1) ^ (self.a if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform_below(rng, n):
    m = rng() * n
    low = m & MASK
    if low < n:
        threshold = (1 << 64) % n
        while low < threshold:
            m = rng() * n
            low = m & MASK
    return m >> 64


def window_order(n, seed, epoch):
    p = list(range(n))
    rng = MT19937_64(splitmix64(splitmix64(seed) ^ epoch))
    for i in range(n, 1, -1):
        j = uniform_below(rng, i)
        p[i - 1], p[j] = p[j], p[i - 1]
    return p


if __name__ == "__main__":
    # Self-check against the C++ standard: the 10000th draw of a
    # default-seeded (5489) mt19937_64 is 9981545732273789042.
    g = MT19937_64(5489)
    for _ in range(9999):
        g()
    assert g() == 9981545732273789042
    for n, seed, epoch in [(10, 0, 0), (10, 0, 1), (10, 1234, 0), (13, 1234, 7)]:
        print(f"window_order({n}, {seed}, {epoch}) = {window_order(n, seed, epoch)}")
