import "@xterm/xterm/css/xterm.css";
import "./styles.css";
import { render } from "preact";
import { App } from "./App.js";

render(<App />, document.getElementById("app") as HTMLElement);
