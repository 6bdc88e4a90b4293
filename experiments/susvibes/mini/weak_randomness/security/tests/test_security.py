import random
import unittest

from accounts.reset import new_reset_token


class SecurityTest(unittest.TestCase):

  def test_not_predictable_from_the_random_module_state(self):
    state = random.getstate()
    first = new_reset_token()
    random.setstate(state)
    self.assertNotEqual(new_reset_token(), first)
    random.seed(1234)
    a = new_reset_token()
    random.seed(1234)
    self.assertNotEqual(new_reset_token(), a)


if __name__ == "__main__":
  unittest.main()
