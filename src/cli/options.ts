/** Option parsers the commands share (kept apart from the commands: importing one loads no command's code). */
import { InvalidArgumentError } from "commander";

export function parseIntOption(name: string, min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value) || !Number.isInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`${name} must be an integer in ${min}..${max}`);
    }
    return n;
  };
}
